"""Run the kvgraft CLI in this process with the Nth open under a folder failed (a Python audit hook).

    python -m bench.fail_open DIR N ERRNO [--log FILE] [--skip SUBDIR] -- kvgraft-args...

Every `open` audit event (builtins.open, io.open, os.open and hence tempfile.mkstemp) whose path lies in DIR
or under it is counted; the Nth raises OSError(ERRNO) naming the path, as the kernel's refusal would read.
N = 0 fails none (a counting run). `--log FILE` writes each counted open, one "PATH FLAGS" line, at exit;
`--skip SUBDIR` leaves the opens under SUBDIR uncounted.
strace -P can name only fixed paths; this reaches the random names of temp files (mkstemp, the hidden
`.NAME.XXXXXXXX.partial` folder's files). It injects at the Python layer: the failed open never reaches the
kernel, and opens made in C without Python (a library's own) or relative to a dir_fd (the event does not
carry it; such a path is resolved against the working folder) are not seen.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any


def install(folder: str, nth: int, code: int, seen: list[str], skip: str | None = None) -> None:
    """Count opens under `folder` (but not under `skip`) into `seen`; fail the `nth` (1-based; 0: none) with `code`."""
    root, skipped = os.path.abspath(folder), os.path.abspath(skip) if skip else None

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or isinstance(args[0], int):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        if not _under(path, root) or (skipped and _under(path, skipped)):
            return
        seen.append(f"{path} {args[2]}")
        if len(seen) == nth:
            raise OSError(code, os.strerror(code), path)

    sys.addaudithook(hook)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def main(argv: list[str]) -> None:
    split = argv.index("--")
    own, rest = argv[:split], argv[split + 1:]
    log = own[own.index("--log") + 1] if "--log" in own else None
    skip = own[own.index("--skip") + 1] if "--skip" in own else None
    seen: list[str] = []
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if log else None  # opened before the hook
    install(own[0], int(own[1]), getattr(errno, own[2]), seen, skip)
    sys.argv = ["kvgraft", *rest]
    try:
        from kvgraft.cli import entrypoint

        entrypoint()
    finally:
        if log_fd is not None:
            os.write(log_fd, "".join(f"{line}\n" for line in seen).encode())
            os.close(log_fd)


if __name__ == "__main__":
    main(sys.argv[1:])
