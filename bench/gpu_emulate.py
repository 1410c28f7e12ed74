"""A fresh venv that sees only the GPU machine's packages, for the GPU check's dry run on this machine.

Run: python3 bench/gpu_emulate.py VENV [--from SITE_PACKAGES] [--machine-wheels DIR]
     python3 bench/gpu_emulate.py SCRATCH --check-wheels 3.12 bench/wheels/py3.12
     python3 bench/gpu_emulate.py VENV --ran OUT/gpu_check.json

The GPU machine (bench/gpu_machine_packages.txt) has torch, transformers, safetensors, typer, rich,
scipy and more, but not cryptography, rfc8785, jsonschema(-rs) or sigstore, and reaches no package
index. This builds VENV (no system site packages) whose only third-party packages are links to the
distributions of SITE_PACKAGES (default: this Python's) that the GPU machine also has, one link per
top-level file or folder of each such distribution, in VENV/gpu-machine-site, named by a .pth file.
Everything else must come from the carried wheel folder, exactly as there. The list's NAME==VERSION
lines are that machine's versions where they decide which code paths work (torch 2.11.0, transformers
5.17.0, huggingface-hub 1.33.0 and what it imports, tokenizers 0.23.2): those are downloaded from PyPI (into
--machine-wheels) with their dependencies and installed into VENV/gpu-machine-pinned, ahead of the links,
instead of linking this machine's versions, together with those of their dependencies that the GPU machine's
list names and this machine lacks (torch 2.11.0's CUDA 13 libraries and triton: the index's only torch 2.11.0
for Linux x86-64 is the CUDA build, which does not import without them and runs on the CPU with them; about
2.6 GB of wheels, 4.4 GB installed). It then checks that the packages the GPU machine lacks cannot be imported
from VENV and that the pinned versions are the ones imported: a dry run that passes here would otherwise
prove nothing about the wheel folder. `--ran RESULT` afterwards: fail unless the GPU check's result JSON
says it ran under the pinned torch.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = HERE / "gpu_machine_packages.txt"
# Import names of what the GPU machine lacks and the GPU check may import: none may be visible here.
ABSENT = ("cryptography", "_cffi_backend", "rfc8785", "jsonschema", "jsonschema_rs", "referencing", "rpds",
          "sigstore", "gguf", "kvgraft")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# Needed here only by this machine's newer versions of listed packages (huggingface_hub 2.4 imports
# httpx2; the GPU machine's 1.33 does not): linked too, as the GPU machine's own versions need nothing more.
VERSION_SKEW = ("httpx2", "httpcore2", "truststore")


def _listed() -> list[str]:
    return [line.strip() for line in PACKAGES.read_text().splitlines() if line.strip() and not line.startswith("#")]


def machine_packages() -> set[str]:
    listed = {normalize(line.split("==")[0]) for line in _listed()}
    return (listed | {normalize(n) for n in VERSION_SKEW}) - {"pip"}  # the venv has its own pip


def machine_pins() -> dict[str, str]:
    """The list's NAME==VERSION lines: normalized name -> version."""
    return {normalize(line.split("==")[0]): line.split("==")[1] for line in _listed() if "==" in line}


def install_pins(python: Path, target: Path, wheels: Path, site: Path) -> list[str]:
    """The pinned versions from PyPI (wheels, cached in `wheels`) into `target`, with those of their dependencies
    that the GPU machine has and `site` lacks (torch 2.11.0's CUDA libraries and triton); the names installed."""
    pins = [f"{n}=={v}" for n, v in sorted(machine_pins().items())]
    wheels.mkdir(parents=True, exist_ok=True)
    quiet = ["-q", "--disable-pip-version-check", "--only-binary=:all:"]
    # With their dependencies, resolved together (pip keeps the files already in `wheels`).
    subprocess.run([str(python), "-m", "pip", "download", *quiet, "-d", str(wheels), *pins], check=True)
    here = {normalize(d.metadata["Name"] or "") for d in md.distributions(path=[str(site)])}
    downloaded = {normalize(f.name.split("-")[0]) for f in wheels.glob("*.whl")}
    needed = sorted((downloaded & machine_packages()) - here - set(machine_pins()))
    # By name from the folder, so that a wheel left there by an earlier pin is not installed beside the new one.
    subprocess.run([str(python), "-m", "pip", "install", *quiet, "--no-deps", "--no-index", "--find-links", str(wheels),
                    "--no-compile", "--target", str(target), *pins, *needed], check=True)
    return sorted(machine_pins()) + needed


def link_distributions(site: Path, target: Path) -> list[str]:
    """Link each top-level entry of the distributions in `site` that the GPU machine has; return their names."""
    wanted = machine_packages() - set(machine_pins())  # the pinned ones are installed at that machine's version
    target.mkdir(parents=True, exist_ok=True)
    linked = []
    for dist in md.distributions(path=[str(site)]):
        name = normalize(dist.metadata["Name"] or "")
        if name not in wanted or dist.files is None:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files}
        for top in sorted(tops):
            src = site / top
            # Files outside site-packages (scripts in ../../bin) and .pth hooks are not part of the import tree.
            if top in ("..", "__pycache__") or top.endswith(".pth") or not src.exists():
                continue
            dest = target / top
            if not dest.exists():
                dest.symlink_to(src)
        linked.append(name)
    return sorted(linked)


def build(venv_dir: Path, site: Path, machine_wheels: Path) -> list[str]:
    venv.EnvBuilder(with_pip=True, clear=True, symlinks=True).create(venv_dir)
    python = venv_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    install_pins(python, venv_dir / "gpu-machine-pinned", machine_wheels, site)
    linked = link_distributions(site, venv_dir / "gpu-machine-site")
    # .pth lines join sys.path in order: the pinned versions first.
    (Path(purelib) / "gpu-machine.pth").write_text(f"{venv_dir / 'gpu-machine-pinned'}\n{venv_dir / 'gpu-machine-site'}\n")
    check_absent(python)
    return linked


def check_absent(python: Path) -> None:
    """Fail unless torch imports, none of ABSENT does and each pinned distribution imports at its version
    (from this venv, with PYTHONPATH cleared)."""
    pins = machine_pins()
    probe = ("import importlib.util, importlib.metadata as md, sys, torch, transformers, safetensors, typer, rich, scipy; "
             f"seen = [m for m in {ABSENT!r} if importlib.util.find_spec(m) is not None]; "
             # A local version label (torch's +cu130) is the build, not the release pinned.
             f"off = [f'{{n}} {{md.version(n)}} (pinned {{v}})' for n, v in {pins!r}.items() "
             "if md.version(n).split('+')[0] != v]; "
             "off += [f'transformers {transformers.__version__} imported'] "
             f"if transformers.__version__ != {pins.get('transformers')!r} else []; "
             "off += [f'torch {torch.__version__} imported'] "
             f"if {pins.get('torch')!r} not in (None, torch.__version__.split('+')[0]) else []; "
             "sys.exit('importable without the wheel folder: ' + ', '.join(seen) if seen else "
             "'not at the GPU machine version: ' + ', '.join(off) if off else 0)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", probe], env=env, cwd="/", capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{python}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")


# Run with the carried wheels (and the tree) on PYTHONPATH: kvgraft's torch-free uses of every carried
# module with compiled code: signing (cryptography, cffi's backend), RFC 8785 digests, schema validation
# (jsonschema-rs; jsonschema with referencing and rpds-py), and cffi with pycparser.
WHEEL_PROBE = """
import sys, cffi, rpds
from kvgraft import schema
from kvgraft.errors import SchemaError
from kvgraft.signing import keys
import kvgraft.signing.verify
from kvgraft._internal.digest import digest_json
key = keys.generate()
assert keys.verify(key.public_key(), keys.sign(key, b"probe"), b"probe")
assert digest_json({"b": 1, "a": [1.5, "x"]}) == digest_json({"a": [1.5, "x"], "b": 1})
try:
    schema.validate({}, "claims.v1.json", "probe")
    sys.exit("an empty claims file validated")
except SchemaError:
    pass
ffi = cffi.FFI()
ffi.cdef("int abs(int);")
assert ffi.dlopen(None).abs(-3) == 3 and rpds.HashTrieMap({1: 2})[1] == 2
print("Python %d.%d.%d" % sys.version_info[:3])
"""
# What the carried modules import from the GPU machine's own packages (its list has both).
WHEEL_PROBE_MACHINE = ("attrs", "typing-extensions")


def find_python(version: str) -> Path | None:
    """A CPython `version` on this machine: pythonX.Y on PATH when it runs (a pyenv shim runs only for a
    version chosen), else pyenv's installed one; None when neither."""
    found: list[str | Path | None] = [shutil.which(f"python{version}")]
    pyenv = shutil.which("pyenv")
    if pyenv:  # its root: what it says (PYENV_ROOT, else ~/.pyenv), and where it lies (ROOT/libexec/pyenv)
        said = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        for root in dict.fromkeys([*([Path(said)] if said else []), Path(pyenv).resolve().parent.parent]):
            found += sorted(root.glob(f"versions/{version}.*/bin/python{version}"))
    for python in found:
        if python and subprocess.run([str(python), "-c", "pass"], capture_output=True).returncode == 0:
            return Path(python)
    return None


def check_wheels(python: Path, wheels: Path, scratch: Path) -> str:
    """Install the wheel folder with `python` as bench/gpu_check.sh does (pip --no-index refuses a wheel
    whose tags that Python does not take), then run WHEEL_PROBE there; its last line (the version)."""
    files = sorted(str(f) for f in wheels.glob("*.whl"))
    if not files:
        raise SystemExit(f"{wheels}: no wheels")
    quiet = ["-q", "--disable-pip-version-check", "--no-compile", "--no-deps"]
    for what, target, names in (("--no-index", "site", files), ("--only-binary=:all:", "machine", WHEEL_PROBE_MACHINE)):
        done = subprocess.run([str(python), "-m", "pip", "install", *quiet, what, "--target", str(scratch / target), *names],
                              capture_output=True, text=True)
        if done.returncode != 0:  # pip's own reason, e.g. "... is not a supported wheel on this platform."
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or [str(done.returncode)]
            raise SystemExit(f"{python}: pip install {what} {' '.join(Path(n).name for n in names)}: {errors[-1]}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (scratch / "site", scratch / "machine", HERE.parent))}
    out = subprocess.run([str(python), "-c", WHEEL_PROBE], env=env, cwd=scratch, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{python} with {wheels}: {(out.stderr.strip() or str(out.returncode)).splitlines()[-1]}")
    return out.stdout.strip().splitlines()[-1]


def check_ran(result: Path) -> str:
    """Fail unless the GPU check's result JSON is a dry run's under the pinned torch (its release, whatever its
    build: 2.11.0+cu130 here on the CPU); what it ran, in words."""
    import json

    machine = json.loads(result.read_text())["machine"]
    want = machine_pins().get("torch")
    ran = str(machine.get("torch", ""))
    if want is not None and ran.split("+")[0] != want:
        raise SystemExit(f"{result}: ran torch {ran or '(none said)'}, not the GPU machine's {want}")
    return (f"{result}: ran torch {ran} (the GPU machine's {want}) on {machine.get('device_name')}, transformers "
            f"{machine.get('transformers')}, Python {machine.get('python')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("venv", type=Path)
    ap.add_argument("--from", dest="site", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
                    help="site-packages holding the GPU machine's packages (default: this Python's)")
    ap.add_argument("--machine-wheels", type=Path, default=None,
                    help="where the pinned versions' wheels are downloaded to (default: VENV/../machine-wheels)")
    ap.add_argument("--check-wheels", nargs=2, metavar=("PYTHON_VERSION", "WHEELS"),
                    help="instead: install WHEELS into a CPython of that version here, if there is one, and use them")
    ap.add_argument("--ran", type=Path, metavar="RESULT",
                    help="instead: fail unless RESULT (a gpu_check.json) says the run used the pinned torch")
    args = ap.parse_args()
    if args.ran:
        print(check_ran(args.ran), file=sys.stderr)
        return
    if args.check_wheels:
        version, folder = args.check_wheels
        python = find_python(version)
        if python is None:  # said, not failed: bench/gpu_check.sh's install on the GPU machine is the check then
            print(f"no CPython {version} on this machine: {folder} not installed here", file=sys.stderr)
            return
        scratch = args.venv.resolve()
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"{folder}: installed with --no-index into {python} ({check_wheels(python, Path(folder), scratch)}), "
              "kvgraft's signing, digests and schema validation ran there", file=sys.stderr)
        return
    wheels = (args.machine_wheels or args.venv.resolve().parent / "machine-wheels").resolve()
    linked = build(args.venv.resolve(), args.site.resolve(), wheels)
    print(f"{args.venv}: {len(linked)} distributions of the GPU machine's list linked from {args.site}; at that "
          f"machine's versions: {', '.join(f'{n} {v}' for n, v in machine_pins().items())}; not importable: "
          f"{', '.join(ABSENT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
