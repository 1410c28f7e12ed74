"""`pull` a verified subset of a release, and the cache of verified pieces: `cache ls`, `cache prune`. No torch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvgraft.cli._base import ReleaseArg, app, echo_json, handled, held, say
from kvgraft.cli.trust import IdentityOpt, IssuerOpt, KeysOpt, OfflineOpt, RequireSignatureOpt, Trust
from kvgraft.errors import InputError
from kvgraft.results.base import JsonObject

cache_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="The local cache of verified pieces of remote releases (docs/remote.md).")
app.add_typer(cache_app, name="cache")


PULL_HELP = """Copy some entries of a release into a local folder, each file checked against the signed root first.

The folder keeps the release's manifest and signatures, so `kvgraft verify OUT --key ...` verifies it
as the release: every present entry checked, the absent ones named absent by kvgraft-subset.json."""
PullEntriesOpt = Annotated[list[str] | None, typer.Option("--entry", "-e", metavar="ID", help="An entry to pull (repeatable).")]
PullSampleOpt = Annotated[int | None, typer.Option(
    "--sample", metavar="N", help="Pull N entries drawn from the release's root digest and --nonce (the draw `audit "
                                  "recompute --sample` makes).")]


@app.command("pull", help=PULL_HELP)
@handled
def pull_cmd(
    release: ReleaseArg,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder to create: the subset, itself a release.")],
    entry: PullEntriesOpt = None, sample: PullSampleOpt = None,
    nonce: Annotated[str | None, typer.Option("--nonce", metavar="X", help="The auditor's nonce for --sample.")] = None,
    key: KeysOpt = None, identity: IdentityOpt = None, issuer: IssuerOpt = None, offline: OfflineOpt = False,
    require_signature: RequireSignatureOpt = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing folder.")] = False,
) -> None:
    """`pull` (PULL_HELP)."""
    from kvgraft import sampling
    from kvgraft.remote import subset
    from kvgraft.remote.location import redact
    from kvgraft.signing.policy import ALL
    from kvgraft.signing.verify import verified, verify

    if (sample is None) == (not entry):
        raise InputError("name the entries to pull: --entry ID (repeatable), or --sample N --nonce X")
    if sample is not None and nonce is None:
        raise InputError("--sample needs --nonce (the draw is the one `audit recompute --sample N --nonce X` makes)")
    policy = Trust(key, identity, issuer, offline, require_signature=require_signature).policy()
    checked = held(verified(release, policy))
    rel = checked.release
    drawn: JsonObject | None = None
    ids = list(entry or [])
    if sample is not None and nonce is not None:
        ids = sampling.drawn_ids(str(rel.manifest["root_digest"]), sampling.check_nonce(nonce), rel.entry_ids(), sample)
        drawn = {"method": sampling.METHOD, "nonce": nonce, "size": sample}
    made = subset.pull(rel, ids, out_dir, origin=redact(release), sample=drawn, overwrite=overwrite)
    with verify(out_dir, policy, ALL) as pulled:  # the subset, verified as anyone given it will verify it
        result = pulled.checked
    for warning in checked.warnings:
        say(f"kvgraft: note: {warning}", error=True)
    say(f"pulled {len(made.entries)} of {rel.num_entries} entries of {redact(release)} into {out_dir}")
    say(f"  verified     {result.signature.describe()}; {len(result.checked_entries)} entries, {result.tensors} tensors")
    say(f"  root digest  {result.root_digest}")


@cache_app.command("ls")
@handled
def cache_ls_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the listing as JSON.")] = False,
    limit: Annotated[int, typer.Option("--limit", help="Pieces to list, most recently used first (0: all).")] = 20,
) -> None:
    """List the cache of verified pieces: where it is, its size limit, each piece (SHA-256, size, last use)."""
    from kvgraft.remote.cache import Cache, age

    if limit < 0:  # as inspect's: a count, never a slice from the end
        raise InputError(f"--limit {limit}: expected a number of at least 0 (0: all)")
    cache = Cache()
    pieces = sorted(cache.pieces(), key=lambda p: -p.used)
    total = sum(p.size for p in pieces)
    if as_json:
        echo_json({"cache": str(cache.root), "limit_bytes": cache.limit, "bytes": total,
                   "partial_bytes": cache.partial_bytes(),
                   "pieces": [{"sha256": p.sha256, "bytes": p.size, "used": p.used, "in_use": p.in_use} for p in pieces]})
        return
    say(f"cache {cache.root}: {len(pieces)} pieces, {total / 2**20:.1f} MiB of {cache.limit / 2**30:.1f} GiB "
        f"(KVGRAFT_CACHE_LIMIT); {cache.partial_bytes() / 2**20:.1f} MiB of fetches not finished")
    for p in pieces[:limit or None]:
        say(f"  {p.sha256[:16]}  {p.size:>14,} B  used {age(p.used)}{'  (in use)' if p.in_use else ''}")
    if limit and len(pieces) > limit:
        say(f"  ... {len(pieces) - limit} more (--limit 0 lists all)")


@cache_app.command("prune")
@handled
def cache_prune_cmd(
    max_size: Annotated[str | None, typer.Option("--max-size", help="Evict least recently used pieces down to this "
                                                                    "size (e.g. 20GiB; default: KVGRAFT_CACHE_LIMIT).")]
    = None,
    everything: Annotated[bool, typer.Option("--all", help="Evict every piece no running process uses.")] = False,
) -> None:
    """Remove what crashed or interrupted processes left (their mirror folders, unfinished fetches) and evict
    the least recently used pieces until the cache fits its limit. Pieces a running process uses stay."""
    from kvgraft.remote.cache import Cache, parse_size

    if everything and max_size is not None:
        raise InputError("--all and --max-size exclude each other")
    cache = Cache()
    mirrors, partials = cache.prune_stale()
    limit = 0 if everything else (parse_size(max_size, "--max-size") if max_size is not None else cache.limit)
    removed = cache.evict(limit)
    left = sum(p.size for p in cache.pieces())
    say(f"pruned {cache.root}: {len(removed)} pieces evicted ({sum(p.size for p in removed) / 2**20:.1f} MiB), "
        f"{mirrors} stale mirror folders and {partials} unfinished fetches removed; {left / 2**20:.1f} MiB left")
