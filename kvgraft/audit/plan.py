"""Audit plans: TOML files that say what `kvgraft audit run` checks, validated against their schema."""

from __future__ import annotations

import math
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgraft._internal.digest import digest_json
from kvgraft._internal.jsonio import MAX_DEPTH, MAX_INT, MAX_JSON_BYTES, read_bounded
from kvgraft.errors import InputError, short_int, short_repr
from kvgraft.results.base import JsonObject
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

    def check(self, name: str) -> JsonObject | None:
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
    """A plan read, parsed and every value checked (types and bounds: _check_values, then the schema), before
    anything it names is read or loaded."""
    path = Path(path)
    raw = read_bounded(path, MAX_JSON_BYTES, "an audit plan")
    try:
        doc = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise InputError(f"{path}: invalid TOML: nested deeper than {MAX_DEPTH} levels") from None
    _check_values(doc, path)
    if doc.get("format") != "kvgraft-audit-plan":
        raise InputError(f"{path}: not a kvgraft audit plan (format {short_repr(doc.get('format'))})")
    validate(doc, PLAN_SCHEMA, str(path))
    return Plan(path, doc)


def _check_values(doc: dict[str, Any], path: Path) -> None:
    """What a plan may hold anywhere, its free-form tables (`executor`, a plugin's check) included: nesting at
    most MAX_DEPTH deep, integers JSON can carry exactly (a plan is digested as canonical JSON), finite
    numbers (TOML's nan and inf compare false with every schema bound), no TOML dates or times."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 1)]
    while stack:
        value, key, depth = stack.pop()
        where = f"{path}: {short_repr(key, 80)[1:-1] if key else 'the plan'}"
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                stack.extend((v, f"{key}.{k}" if key else str(k), depth + 1) for k, v in value.items())
            else:
                stack.extend((v, f"{key}[{i}]", depth + 1) for i, v in enumerate(value))
        elif isinstance(value, bool | str):
            continue
        elif isinstance(value, int):
            if abs(value) > MAX_INT:
                raise InputError(f"{where}: {short_int(value)} is beyond the integers a plan may hold (+-(2^53-1))")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InputError(f"{where}: {value} is not a finite number")
        else:
            raise InputError(f"{where}: a TOML {type(value).__name__} value; a plan holds strings, numbers, booleans, "
                             "arrays and tables")


# Folders of the kernel's pseudo file systems: a report written there is a write to the kernel, never a file.
_PSEUDO = ("/proc", "/sys", "/dev")


def check_paths(plan: Plan, out: Path) -> None:
    """What the plan names on disk, before any model loads: the output folder can take the report, is no pseudo
    file system and does not lie in the audited release (whose signature lists its files); the release, records,
    claims and key files it names are there."""
    from kvgraft._internal.jsonio import check_writable, require_folder, stat_or_none

    resolved = out.resolve()
    for pseudo in map(Path, _PSEUDO):
        if resolved == pseudo or pseudo in resolved.parents:
            raise InputError(f"{out}: the output folder is under {pseudo}, a pseudo file system; choose a folder "
                             "for the report")
    check_writable(out / "report.json")
    spec = plan.doc["release"]
    if "path" in spec and "://" not in spec["path"]:
        release = plan.resolve(spec["path"])
        require_folder(release, " (the plan's release)")
        if resolved == release.resolve() or release.resolve() in resolved.parents:
            raise InputError(f"{out}: the output folder is the audited release {release} or lies in it; a report "
                             "written there would change the signed release")
    named = {"release.records": spec.get("records"), "checks.claims.file": plan.doc["checks"].get("claims", {}).get("file"),
             "signing.key": plan.doc.get("signing", {}).get("key")}
    for key, name in named.items():
        if not name or name in ("example", "ephemeral"):
            continue
        st = stat_or_none(plan.resolve(name), follow=True)
        if st is None or not stat.S_ISREG(st.st_mode):
            raise InputError(f"{plan.resolve(name)}: {key} names {'nothing' if st is None else 'no regular file'} "
                             f"there")
