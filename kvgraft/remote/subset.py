"""A verified local subset of a release (`kvgraft pull`): some entries' files, with the signed manifest they belong to.

The subset folder holds the release's manifest.json and signature files unchanged (so the signed root
is the same and `kvgraft verify` checks it with the same key), the index files that hold the pulled
entries' records (format 2: their shards and the prefix index), those entries' files, and
`kvgraft-subset.json`, which says which entries are present. An entry absent from that list is absent by
design; a file it lists that is missing, or a file it does not list, is an error (`check_folder`).
`kvgraft verify` on a subset checks the signature, the manifest, the listed index files and every
present entry's file, and says how many entries are absent. The list itself is not signed: it says only
what is present, and every present byte is checked against the signed root.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvgraft._internal import jsonio
from kvgraft.errors import InputError, IntegrityError
from kvgraft.release import integrity
from kvgraft.release.format import SIDE_FILES, Release, now_utc
from kvgraft.release.records import MANIFEST, safe_path
from kvgraft.remote.transfer import place
from kvgraft.results.base import JsonObject

SUBSET_NAME = "kvgraft-subset.json"
SUBSET_FORMAT = "kvgraft-release-subset"
MAX_SUBSET_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Subset:
    root_digest: str
    entries: list[str]  # present, in release order
    files: list[str]  # every release file present besides manifest.json and the signatures
    origin: str
    sample: JsonObject | None  # {"method", "nonce", "size"} when the entries are an audit sample (carried, not read)


def read(root: Path) -> Subset | None:
    """The subset list of the folder `root`, None when it is a whole release."""
    path = root / SUBSET_NAME
    if jsonio.stat_or_none(path) is None:
        return None
    doc = jsonio.loads_strict(jsonio.read_bounded(path, MAX_SUBSET_BYTES, "a subset list"), str(path))
    ok = (isinstance(doc, dict) and doc.get("format") == SUBSET_FORMAT and doc.get("format_version") == 1
          and isinstance(doc.get("root_digest"), str) and isinstance(doc.get("origin"), str)
          and all(isinstance(doc.get(k), list) and all(isinstance(x, str) for x in doc[k]) for k in ("entries", "files"))
          and (doc.get("sample") is None or isinstance(doc.get("sample"), dict)))
    if not ok:
        raise InputError(f"{path}: not a kvgraft subset list (format {SUBSET_FORMAT!r}, version 1, root_digest, origin, "
                         f"entries, files)")
    return Subset(doc["root_digest"], list(doc["entries"]), list(doc["files"]), doc["origin"], doc.get("sample"))


def _needed(rel: Release, ids: list[str]) -> list[str]:
    """The release files a subset of `ids` holds: their index shards and the prefix index (format 2), their files."""
    names: list[str] = []
    idx = rel.index
    if idx is not None:
        shards = sorted({idx.owner[eid] for eid in ids})
        names += [idx.shards[k]["file"] for k in shards]
        if idx.prefix_meta is not None:
            names.append(idx.prefix_meta["file"])
    names += sorted({e["file"] for e in rel.records(ids)})
    return names


def pull(rel: Release, ids: list[str], out: Path, *, origin: str, sample: JsonObject | None = None,
         overwrite: bool = False) -> Subset:
    """Write the subset of `rel` (opened through kvgraft.remote, or a local folder) holding `ids` at `out`.

    Each entry's file is checked as `kvgraft verify --entry` checks it (for a remote release it was
    fetched and checked first); the index files as reading them checks them. Written in a temp folder
    beside `out` and renamed into place: an interrupted pull leaves no subset.
    """
    if not ids:
        raise InputError("name the entries to pull (--entry ID, or --sample N --nonce X)")
    order = {eid: i for i, eid in enumerate(rel.entry_ids())}
    unknown = [eid for eid in ids if eid not in order]
    if unknown:
        rel.entry(unknown[0])  # raises, naming the entries there are
    ids = sorted(set(ids), key=order.__getitem__)
    jsonio.refuse_existing(out, overwrite)
    for eid in ids:
        integrity.check_entry(rel, eid)  # size, SHA-256 and header (reads its shard first)
    if rel.index is not None:
        rel.prefix_table()  # the prefix index, fetched and checked (a subset can serve `run --prefix`)
    files = _needed(rel, ids)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        for name in [MANIFEST, *SIDE_FILES, *files]:
            src = rel.root / name
            if name in SIDE_FILES and jsonio.stat_or_none(src) is None:
                continue
            # Copies (reflinks where the file system makes them), never links: a pulled file may be changed by its
            # owner without changing the cache's piece or the release it came from, and the cache stays bounded.
            place(safe_path(rel.root, name, "a pulled file"), tmp / name, hard=False)
        subset = Subset(str(rel.manifest["root_digest"]), ids, files, origin, sample)
        jsonio.write_json(tmp / SUBSET_NAME, {
            "format": SUBSET_FORMAT, "format_version": 1, "root_digest": subset.root_digest, "origin": origin,
            "pulled": now_utc(), "entries": ids, "files": files, **({"sample": sample} if sample else {})})
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return subset


def check_folder(root: Path, subset: Subset, rel: Release) -> str:
    """The subset folder against its list (module docstring); returns the line saying what is absent."""
    where = root / SUBSET_NAME
    if subset.root_digest != rel.manifest["root_digest"]:
        raise IntegrityError(f"{where}: names root digest {subset.root_digest}, the manifest has "
                             f"{rel.manifest['root_digest']}")
    missing_ids = [eid for eid in subset.entries if eid not in set(rel.entry_ids())]
    if missing_ids:
        raise IntegrityError(f"{where}: lists entry {missing_ids[0]!r}, which the manifest does not")
    allowed = set(_needed(rel, subset.entries))
    if set(subset.files) != allowed:
        odd = sorted(set(subset.files) ^ allowed)
        raise IntegrityError(f"{where}: lists other files than its entries need ({', '.join(odd[:3])})")
    present = integrity.release_folder_files(root) - {MANIFEST, SUBSET_NAME}
    missing, extra = sorted(allowed - present), sorted(present - allowed)
    if missing or extra:
        parts = ([f"missing {', '.join(missing[:5])}"] if missing else []) + \
                ([f"not part of the subset: {', '.join(extra[:5])}"] if extra else [])
        raise IntegrityError(f"{root / missing[0] if missing else root}: files differ from {SUBSET_NAME}: "
                             f"{'; '.join(parts)}")
    idx = rel.index
    if idx is not None:  # the listed index files, each against the manifest
        for k in sorted({idx.owner[eid] for eid in subset.entries}):
            idx.shard(k)
        idx.prefix_pages()  # hashed against the manifest
    absent = rel.num_entries - len(subset.entries)
    return (f"a subset ({SUBSET_NAME}, pulled from {subset.origin}): {len(subset.entries)} of {rel.num_entries} "
            f"entries present and checked; the other {absent} are absent by design")
