"""The verify check: every byte of the release hashed against its manifest, its statement and signature checked."""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.text import Text

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.render.figures import Face
from kvgraft.render.html import esc
from kvgraft.render.text import hanging, num
from kvgraft.render.views import verify_lines
from kvgraft.results.base import JsonObject
from kvgraft.results.verify import TYPED, ShownSignature, VerifyData


def run(ctx: Context, _settings: JsonObject) -> Ran:
    from kvgraft.signing.policy import ALL
    from kvgraft.signing.verify import verify

    ctx.say("verifying the release (hashes, statement, signature)")
    # Every byte, as `kvgraft verify` does, under the policy the run opened it with, through the source it was
    # opened from (a published release: its mirror): opening the release (verified(), in the run) read none
    # of the entries, and the other checks verify only the entries they read.
    v = verify(ctx.release.source, ctx.release.policy, ALL).checked
    return Ran(v.document().model_dump(mode="json", exclude_unset=True),
               f"{v.files} files, {v.bytes_hashed:,} bytes hashed; signature: {v.signature.describe()}")


def status(result: JsonObject) -> str:
    """passed when the release verified; a release that does not verify stops the run before (VerificationError)."""
    return "passed" if result["ok"] else "failed"


def face(data: VerifyData) -> Face:
    if not data.ok:
        return Face(f"release refused: {data.error or 'see details'}")
    verdict = (f"release intact: {num(data.entries)} entries, {num(data.files)} files, "
               f"{num(data.tensors)} tensors, {num(data.bytes_hashed)} bytes hashed against its manifest"
               + ("; every tensor re-hashed" if data.deep else ""))
    sig = data.signature or ShownSignature()
    if sig.status == "verified":
        who = f"key {sig.key_id}" if sig.method == "key" else f"{sig.identity} via {sig.issuer} (Sigstore)"
        signed = f"signature verified: {who}"
    else:
        signed = "signature not checked" + ("" if sig.bundle else ": the release is unsigned")
    return Face(verdict, [signed] + [f"warning: {w}" for w in data.warnings or []])


def details(data: VerifyData, console: Console) -> list[RenderableType]:
    result, lines = verify_lines(data)
    out: list[RenderableType] = [Text(f"result: {result}", style="green" if data.ok else "red")]
    return out + [Text("\n".join(hanging("", d, console.width))) for d in lines]


def html(data: VerifyData) -> str:
    result, lines = verify_lines(data)
    out = f"<p>result: <b>{esc(result)}</b></p>"
    if lines:
        out += "<ul>" + "".join(f"<li>{esc(d)}</li>" for d in lines) + "</ul>"
    return out


KIND = CheckKind(
    name="verify", schema="verify-result.v1.json", status=status, stamps_status=False, run=run, face=face,
    details=details, html=html,
    known_data=("ok", "error", "details", "root_digest", "entries", "files", "tensors", "bytes_hashed", "deep",
                "signature", "format", "format_version", "kvgraft_version", "exit_code", "release"), typed=TYPED)
