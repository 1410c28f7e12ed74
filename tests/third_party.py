"""The one piece of data the tests read outside the project: third-party Sigstore bundles in ../shared.

A user's clone has no ../shared; CI puts it beside the clone. Tests that need the bundles skip, saying
why, when they are absent; nothing else may be read from ../shared (the project's own fixtures live in
tests/fixtures/).
"""

from __future__ import annotations

from pathlib import Path

import pytest

SIGSTORE_BUNDLES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "sigstore"
needs_sigstore_bundles = pytest.mark.skipif(
    not SIGSTORE_BUNDLES.is_dir(),
    reason=f"third-party Sigstore bundles not present at {SIGSTORE_BUNDLES} (they live in ../shared, outside the "
           f"repo; a plain clone has none)")
