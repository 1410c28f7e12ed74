"""A fresh venv that sees only the GPU machine's packages, for the GPU check's dry run on this machine.

Run: python3 bench/gpu_emulate.py VENV [--from SITE_PACKAGES] [--machine-wheels DIR]

The GPU machine (bench/gpu_machine_packages.txt) has torch, transformers, safetensors, typer, rich,
scipy and more, but not cryptography, rfc8785, jsonschema(-rs) or sigstore, and reaches no package
index. This builds VENV (no system site packages) whose only third-party packages are links to the
distributions of SITE_PACKAGES (default: this Python's) that the GPU machine also has, one link per
top-level file or folder of each such distribution, in VENV/gpu-machine-site, named by a .pth file.
Everything else must come from the carried wheel folder, exactly as there. The list's NAME==VERSION
lines are that machine's versions where they decide which code paths work (transformers 5.17.0,
huggingface-hub 1.33.0 and what it imports, tokenizers 0.23.2): those are downloaded from PyPI (into
--machine-wheels) and installed into VENV/gpu-machine-pinned, ahead of the links, instead of linking
this machine's versions. It then checks that the packages the GPU machine lacks cannot be imported
from VENV and that the pinned versions are the ones imported: a dry run that passes here would
otherwise prove nothing about the wheel folder.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
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


def install_pins(python: Path, target: Path, wheels: Path) -> None:
    """The pinned versions from PyPI (pure-Python wheels, cached in `wheels`) into `target`."""
    pins = [f"{n}=={v}" for n, v in sorted(machine_pins().items())]
    wheels.mkdir(parents=True, exist_ok=True)
    quiet = ["-q", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:"]
    subprocess.run([str(python), "-m", "pip", "download", *quiet, "-d", str(wheels), *pins], check=True)
    files = [str(f) for f in sorted(wheels.glob("*.whl")) if normalize(f.name.split("-")[0]) in machine_pins()]
    subprocess.run([str(python), "-m", "pip", "install", *quiet, "--no-index", "--no-compile", "--target", str(target),
                    *files], check=True)


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
    install_pins(python, venv_dir / "gpu-machine-pinned", machine_wheels)
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
             f"off = [f'{{n}} {{md.version(n)}} (pinned {{v}})' for n, v in {pins!r}.items() if md.version(n) != v]; "
             "off += [f'transformers {transformers.__version__} imported'] "
             f"if transformers.__version__ != {pins.get('transformers')!r} else []; "
             "sys.exit('importable without the wheel folder: ' + ', '.join(seen) if seen else "
             "'not at the GPU machine version: ' + ', '.join(off) if off else 0)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", probe], env=env, cwd="/", capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{python}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("venv", type=Path)
    ap.add_argument("--from", dest="site", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
                    help="site-packages holding the GPU machine's packages (default: this Python's)")
    ap.add_argument("--machine-wheels", type=Path, default=None,
                    help="where the pinned versions' wheels are downloaded to (default: VENV/../machine-wheels)")
    args = ap.parse_args()
    wheels = (args.machine_wheels or args.venv.resolve().parent / "machine-wheels").resolve()
    linked = build(args.venv.resolve(), args.site.resolve(), wheels)
    print(f"{args.venv}: {len(linked)} distributions of the GPU machine's list linked from {args.site}; at that "
          f"machine's versions: {', '.join(f'{n} {v}' for n, v in machine_pins().items())}; not importable: "
          f"{', '.join(ABSENT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
