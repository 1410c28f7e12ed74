"""Small synthetic cache releases for tests and benchmarks: random tensors, fixed seed, a fake header.

No model is loaded: the header is schema-valid but names a made-up model; the entries have the same
shape as real captures (per-layer keys/values tensors in one safetensors file per entry).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from kvgraft._internal.digest import digest_json, sha256_hex
from kvgraft.release.format import Release, ReleaseWriter
from kvgraft.release.records import MANIFEST, root_digest, token_ids_digest


def fake_header(*, num_layers: int = 2, dtype: str = "float32", spec: str = "synthetic/tiny-test-model") -> dict[str, Any]:
    """model/schedule/environment members shaped like kvgraft.inference.capture.header()."""

    def h(label: str) -> str:
        return hashlib.sha256(f"{spec}:{label}".encode()).hexdigest()

    return {
        "model": {
            "spec": spec, "architecture": "LlamaForCausalLM", "model_type": "llama", "num_hidden_layers": num_layers,
            "identity": {"sha256": h("identity"), "weights_sha256": h("weights"), "tokenizer_sha256": h("tokenizer"),
                         "config_sha256": h("config"), "num_tensors": 3 * num_layers, "num_parameters": 1000 * num_layers},
        },
        "schedule": {"mode": "one-shot", "chunk_tokens": None, "batch_size": 1, "add_special_tokens": True,
                     "add_generation_prompt": False},
        "environment": {
            "python": "3.11.7", "torch": torch.__version__, "transformers": "0.0.0-synthetic", "kvgraft": "0.1.0",
            "platform": "linux-x86_64", "device": "cpu", "device_name": "synthetic", "dtype": dtype,
            "attn_implementation": "sdpa", "threads": 1, "deterministic_algorithms": True,
        },
    }


def make_release(out: Path, *, entries: int = 3, layers: int = 2, heads: int = 2, tokens: int = 6, head_dim: int = 8,
                 seed: int = 0, spec: str = "synthetic/tiny-test-model", overwrite: bool = False,
                 progress: Any = None, format_version: int = 1, shard_entries: int | None = None,
                 keep_entries: bool = True) -> dict[str, Any]:
    """Write a release of `entries` entries, each with keys/values of shape [1, heads, tokens, head_dim] per layer.

    Each entry file holds 2 * layers float32 tensors of heads * tokens * head_dim * 4 bytes. Returns the
    manifest (Release.flat's shape). Format 1 by default: the tests that edit a manifest in place edit
    the single-manifest layout; `format_version=2` writes the indexed one, as capture does.
    """
    gen = torch.Generator().manual_seed(seed)
    extra: dict[str, Any] = {} if shard_entries is None else {"shard_entries": shard_entries}
    writer = ReleaseWriter(Path(out), overwrite=overwrite, format_version=format_version, keep_entries=keep_entries,
                           **extra)
    try:
        for i in range(entries):
            ids = [int(t) for t in torch.randint(1, 50_000, (tokens,), generator=gen)]
            text = f"synthetic record {i} (seed {seed})"
            layer_meta: list[dict[str, Any]] = []
            tensors: dict[str, torch.Tensor] = {}
            for li in range(layers):
                k, v = f"layer.{li}.keys", f"layer.{li}.values"
                tensors[k] = torch.randn(1, heads, tokens, head_dim, generator=gen)
                tensors[v] = torch.randn(1, heads, tokens, head_dim, generator=gen)
                layer_meta.append({"index": li, "kind": "full", "keys": k, "values": v, "positions": [0, tokens]})
            logits = torch.randn(64, generator=gen)
            entry = {
                "id": f"rec-{i:03d}", "num_tokens": tokens, "token_ids": ids, "token_ids_sha256": token_ids_digest(ids),
                "source": {"kind": "text", "sha256": digest_json(text), "text": text}, "layers": layer_meta,
                "next_token": {"logits_sha256": hashlib.sha256(logits.numpy().tobytes()).hexdigest(),
                               "argmax": int(torch.argmax(logits)), "dtype": "float32"},
            }
            writer.add_entry(entry, tensors)
            if progress is not None:
                progress(i + 1, entries)
        return writer.finish(fake_header(num_layers=layers, spec=spec))
    except BaseException:
        writer.abort()
        raise


def as_format_1(root: Path) -> dict[str, Any]:
    """Rewrite an (unsigned) format-2 release in the single-manifest layout, for tests that edit a
    manifest in place; return the new manifest."""
    import json
    import shutil

    from kvgraft.release.format import Release

    flat = dict(Release.open(root).flat())
    flat.pop("root_digest")
    flat["format_version"] = 1
    flat["root_digest"] = root_digest(flat)
    (Path(root) / MANIFEST).write_text(json.dumps(flat, indent=2))
    shutil.rmtree(Path(root) / "index", ignore_errors=True)
    return flat


def flat_manifest(root: Path) -> dict[str, Any]:
    """A release's records as one document, either layout (Release.flat)."""
    from kvgraft.release.format import Release

    return Release.open(root).flat()


def unsign(root: Path) -> None:
    """Remove a release's signatures: kvgraft's bundle and the OpenSSF model signing one beside it."""
    from kvgraft.signing import attest

    for name in (attest.BUNDLE_NAME, attest.OMS_NAME):
        (Path(root) / name).unlink(missing_ok=True)


def make_many(out: Path, *, entries: int, tokens: int = 4, layers: int = 1, heads: int = 1, head_dim: int = 1,
              seed: int = 0, shard_entries: int | None = None) -> dict[str, Any]:
    """A format-2 release of many entries written fast: every entry file holds the same random tensors
    (one safetensors blob, written once per entry), each entry has its own id and token ids. For
    tests and benchmarks of the index, where only the records and the files' presence matter."""
    from safetensors.torch import save

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    layer_meta: list[dict[str, Any]] = []
    for li in range(layers):
        k, v = f"layer.{li}.keys", f"layer.{li}.values"
        tensors[k] = torch.randn(1, heads, tokens, head_dim, generator=gen)
        tensors[v] = torch.randn(1, heads, tokens, head_dim, generator=gen)
        layer_meta.append({"index": li, "kind": "full", "keys": k, "values": v, "positions": [0, tokens]})
    blob = save(tensors)
    extra: dict[str, Any] = {} if shard_entries is None else {"shard_entries": shard_entries}
    writer = ReleaseWriter(Path(out), format_version=2, keep_entries=False, **extra)
    ids_all = torch.randint(1, 50_000, (entries, tokens), generator=gen).tolist()
    try:
        for i in range(entries):
            ids = [int(t) for t in ids_all[i]]
            text = f"synthetic record {i}"
            writer.add_entry_file({
                "id": f"rec-{i:03d}", "num_tokens": tokens, "token_ids": ids, "token_ids_sha256": token_ids_digest(ids),
                "source": {"kind": "text", "sha256": digest_json(text), "text": text}, "layers": layer_meta,
                "next_token": {"logits_sha256": hashlib.sha256(b"%d" % i).hexdigest(), "argmax": 0, "dtype": "float32"},
            }, blob)
        return writer.finish(fake_header(num_layers=layers))
    except BaseException:
        writer.abort()
        raise


def release_fixtures(base: str = "base", copy: str = "rel", **release: Any) -> tuple[Any, Any]:
    """Two pytest fixtures, named `base` and `copy`: a release made once per module by `make_release(**release)`,
    and a fresh copy of it for each test (which may damage its copy). Assign both in the test module."""

    @pytest.fixture(scope="module", name=base)
    def _base(tmp_path_factory: pytest.TempPathFactory) -> Path:
        root = tmp_path_factory.mktemp(base) / "rel"
        make_release(root, **release)
        return root

    @pytest.fixture(name=copy)
    def _copy(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
        return Path(shutil.copytree(request.getfixturevalue(base), tmp_path / "rel"))

    return _base, _copy


def listed_digests(root: Path) -> dict[str, str]:
    """name -> sha256 of every file the release's manifest lists, manifest.json included (format 2: the index and
    the entry files): what a signer lists. Read from the manifest, not checked against the bytes."""
    return {MANIFEST: sha256_hex((Path(root) / MANIFEST).read_bytes()),
            **{n: f["sha256"] for n, f in Release.open(root).all_files().items()}}


def sign_as(root: Path, private: Path) -> None:
    """Sign the release as it is with `private`, checking nothing: what an attacker publishes under their own
    key after editing it (the victim verifies with `--key` that key)."""
    import json

    from kvgraft.signing import attest, keys

    data = (Path(root) / MANIFEST).read_bytes()
    payload = attest.statement_bytes(attest.statement(json.loads(data), sha256_hex(data), len(data)))
    key = keys.load_private_key(private)
    sig = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    attest.write_bundle(Path(root), json.dumps(attest.key_bundle(payload, sig, keys.key_id(key))).encode())
    (Path(root) / attest.OMS_NAME).unlink(missing_ok=True)


def signed_release(base: Path, *, entries: int, seed: int) -> tuple[Path, Path, Path]:
    """A release at base/rel signed (kvgraft sign) with a new key pair at base/k: (release, private key, public key)."""
    from kvgraft.signing import keys, sign

    private, public = keys.write_keypair(base / "k")
    make_release(base / "rel", entries=entries, seed=seed)
    sign.sign_release(base / "rel", keys.load_private_key(private))
    return base / "rel", private, public


def records_plan(folder: Path, name: str, model: Path | str, texts: list[str], tables: str, probe_tokens: int = 2) -> Path:
    """`folder`/records.jsonl of `texts` (ids r0, r1, …) and `folder`/plan.toml, an audit plan that captures them with
    `model` into its release (under `folder`/out) and then runs `tables` (its [checks.*] and [signing] tables)."""
    import json

    records = folder / "records.jsonl"
    records.write_text("".join(json.dumps({"id": f"r{i}", "text": text}) + "\n" for i, text in enumerate(texts)))
    plan = folder / "plan.toml"
    plan.write_text(f'format = "kvgraft-audit-plan"\nformat_version = 1\nname = "{name}"\nout = "{folder / "out"}"\n'
                    f'[model]\nspec = "{model}"\n[release]\nrecords = "{records}"\nprobe_tokens = {probe_tokens}\n{tables}')
    return plan


def captured_release(lm: Any, out: Path, texts: list[str], signer: Path | None = None) -> Path:
    """A release of `texts` (ids r0, r1, …) captured with the loaded model `lm` at `out`, signed with the private
    key `signer` (kvgraft sign, its bytes checked first) when one is given."""
    from kvgraft.inference.capture import capture

    capture(lm, [(f"text {i}", {"id": f"r{i}", "text": t}) for i, t in enumerate(texts)], out, probe_tokens=2)
    if signer is not None:
        from kvgraft.signing import keys, sign

        sign.sign_release(out, keys.load_private_key(signer))
    return out


def replication_plan(folder: Path, name: str, model: Path | str, release: Path, tables: str, *,
                     signer_pub: Path | None = None) -> Path:
    """`folder`/plan.toml: an audit of the existing `release` (whose signer must be `signer_pub` when given) with
    `model`, running `tables` (its [checks.*] and [signing] tables), writing under `folder`/out."""
    plan = folder / "plan.toml"
    named = f'key = "{signer_pub}"\n' if signer_pub is not None else ""
    plan.write_text(f'format = "kvgraft-audit-plan"\nformat_version = 1\nname = "{name}"\nout = "{folder / "out"}"\n'
                    f'[model]\nspec = "{model}"\n[release]\npath = "{release}"\n{named}{tables}')
    return plan
