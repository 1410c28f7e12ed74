"""Audit plans: TOML files that say what `kvgraft audit run` checks, validated against their schema."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgraft._internal.digest import digest_json
from kvgraft._internal.jsonio import MAX_JSON_BYTES, read_bounded
from kvgraft.errors import InputError
from kvgraft.schema import validate

if TYPE_CHECKING:
    from kvgraft.signing.policy import VerifyPolicy

PLAN_SCHEMA = "audit-plan.v1.json"


@dataclass(frozen=True)
class Plan:
    path: Path
    doc: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.doc["name"])

    @property
    def sha256(self) -> str:
        return digest_json(self.doc)

    def check(self, name: str) -> dict[str, Any] | None:
        """The settings of a check, or None when the plan leaves it out or disables it."""
        c = self.doc["checks"].get(name)
        if c is None or not c.get("enabled", True):
            return None
        return dict(c)

    def resolve(self, rel: str) -> Path:
        """A path named in the plan, relative to the plan's folder unless absolute."""
        p = Path(rel)
        return p if p.is_absolute() else (self.path.parent / p)

    def out_dir(self, override: Path | None = None) -> Path:
        return override or Path(self.doc.get("out", f"out/{self.name}"))

    def release_policy(self) -> VerifyPolicy:
        """The policy `[release]`'s trust options ask for (those of `kvgraft verify`; paths relative to the plan):
        whose signature the existing release must carry. None given: its signature is not checked."""
        from kvgraft.signing.policy import keys_policy

        spec = self.doc.get("release", {})
        given = spec.get("key")
        named = [given] if isinstance(given, str) else list(given or [])
        oms = spec.get("oms_signature")
        try:
            return keys_policy([self.resolve(k) for k in named], identity=spec.get("identity"),
                               issuer=spec.get("issuer"), require_signature=bool(spec.get("require_signature")),
                               oms_signature=self.resolve(oms) if oms else None)
        except InputError as exc:
            raise InputError(f"{self.path}: [release]: {exc}") from None


def single(kind: str, settings: dict[str, Any], *, model: str | None = None) -> Plan:
    """The plan of a single-check command (`audit recompute`, `audit claims`, ...): its one check, with the
    command's options as that check's settings; relative paths are relative to the current directory."""
    doc: dict[str, Any] = {"format": "kvgraft-audit-plan", "format_version": 1, "name": f"audit {kind}",
                           "checks": {kind: settings}}
    if model is not None:
        doc["model"] = {"spec": model}
    return Plan(Path(f"audit-{kind}"), doc)


def load(path: Path | str) -> Plan:
    path = Path(path)
    raw = read_bounded(path, MAX_JSON_BYTES, "an audit plan")
    try:
        doc = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: invalid TOML: {exc}") from None
    if doc.get("format") != "kvgraft-audit-plan":
        raise InputError(f"{path}: not a kvgraft audit plan (format {doc.get('format')!r})")
    validate(doc, PLAN_SCHEMA, str(path))
    return Plan(path, doc)
