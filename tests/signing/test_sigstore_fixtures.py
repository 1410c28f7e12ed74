"""Real Sigstore bundles verified offline through kvgraft's own code path (kvgraft.signing.sigstore).

The bundles come from sigstore-python's test assets, kept outside the repository in
../shared/fixtures/sigstore/ (see its README.md). A user's clone has no ../shared: these tests
then skip, saying so; in CI the folder is present.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import InputError, VerificationError
from kvgraft.signing import attest
from kvgraft.signing.policy import SignedByIdentity, SignedWithKeys
from kvgraft.signing.sigstore import SigstoreTrust, sigstore_verifier, verify_sigstore_bundle
from tests.verifying import verify_result

from release_factory import make_release
from third_party import SIGSTORE_BUNDLES, needs_sigstore_bundles

FIXTURES = SIGSTORE_BUNDLES
pytestmark = needs_sigstore_bundles

STAGING = SigstoreTrust(staging=True, offline=True)
PRODUCTION = SigstoreTrust(offline=True)
GH = "https://github.com/login/oauth"
ACTIONS = "https://token.actions.githubusercontent.com"
BEACON = ("https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/"
          "extremely-dangerous-oidc-beacon.yml@refs/heads/main")
DSSE_BUNDLE = "a.dsse.staging-rekor-v2.txt.sigstore.json"

# artifact, bundle, trust, identity, issuer (README.md of the fixtures folder)
CASES = [
    ("bundle.txt", "bundle.txt.sigstore", "staging", "a@tny.town", GH),
    ("bundle_v3.txt", "bundle_v3.txt.sigstore", "staging", "william@yossarian.net", GH),
    ("staging-rekor-v2.txt", "staging-rekor-v2.txt.sigstore.json", "staging", "jku@goto.fi", GH),
    ("bundle_v3_github.whl", "bundle_v3_github.whl.sigstore", "production",
     "https://github.com/trailofbits/rfc8785.py/.github/workflows/release.yml@refs/tags/v0.1.2", ACTIONS),
    ("tsa_bundle.txt", "tsa_bundle.txt.sigstore", "tsa", "alexis.challande@trailofbits.com", "https://accounts.google.com"),
]


@pytest.fixture(autouse=True)
def private_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore writes its embedded trust root under the XDG folders: keep them per test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


def trust_for(name: str) -> SigstoreTrust:
    if name == "tsa":
        return SigstoreTrust(trusted_root=FIXTURES / "tsa_trust_config.json")
    return STAGING if name == "staging" else PRODUCTION


@pytest.mark.parametrize(("artifact", "bundle", "trust", "identity", "issuer"), CASES, ids=[c[0] for c in CASES])
def test_real_bundle_verifies_offline_with_its_identity(artifact: str, bundle: str, trust: str, identity: str,
                                                        issuer: str) -> None:
    data = (FIXTURES / artifact).read_bytes()
    raw = (FIXTURES / bundle).read_bytes()
    result = verify_sigstore_bundle(data, raw, identity=identity, issuer=issuer, trust=trust_for(trust), where=bundle)
    assert (result.identity, result.issuer) == (identity, issuer)
    assert result.payload is None  # message-signature bundles carry no payload
    # the streamed path (a file hashed by kvgraft, handed to sigstore prehashed) agrees
    verify_sigstore_bundle(FIXTURES / artifact, raw, identity=identity, issuer=issuer, trust=trust_for(trust))


@pytest.mark.parametrize(("artifact", "bundle", "trust", "identity", "issuer"), CASES, ids=[c[0] for c in CASES])
def test_real_bundle_with_a_wrong_identity_is_rejected(artifact: str, bundle: str, trust: str, identity: str,
                                                       issuer: str) -> None:
    data = (FIXTURES / artifact).read_bytes()
    raw = (FIXTURES / bundle).read_bytes()
    with pytest.raises(VerificationError, match="Sigstore verification failed") as info:
        verify_sigstore_bundle(data, raw, identity="mallory@example.com", issuer=issuer, trust=trust_for(trust), where=bundle)
    assert bundle in info.value.diagnostics() and "\n" not in info.value.diagnostics()
    assert "mallory@example.com" in info.value.diagnostics()
    with pytest.raises(VerificationError, match="Sigstore verification failed"):
        verify_sigstore_bundle(data, raw, identity=identity, issuer="https://issuer.invalid", trust=trust_for(trust))


def test_altered_artifact_is_rejected() -> None:
    with pytest.raises(VerificationError, match="digest mismatch") as info:
        verify_sigstore_bundle((FIXTURES / "bad.txt").read_bytes(), (FIXTURES / "bundle.txt.sigstore").read_bytes(),
                               identity="a@tny.town", issuer=GH, trust=STAGING, where="bundle.txt.sigstore")
    assert info.value.exit_code == 1


def test_bundle_checked_against_the_wrong_trust_root_is_rejected() -> None:
    """A staging bundle does not chain to the production root."""
    with pytest.raises(VerificationError, match="Sigstore verification failed"):
        verify_sigstore_bundle((FIXTURES / "bundle_v3.txt").read_bytes(), (FIXTURES / "bundle_v3.txt.sigstore").read_bytes(),
                               identity="william@yossarian.net", issuer=GH, trust=PRODUCTION)


def test_real_dsse_bundle_returns_its_verified_statement() -> None:
    raw = (FIXTURES / DSSE_BUNDLE).read_bytes()
    result = verify_sigstore_bundle(None, raw, identity=BEACON, issuer=ACTIONS, trust=STAGING)
    assert result.payload_type == "application/vnd.in-toto+json"
    assert result.payload is not None and b'"_type":"https://in-toto.io/Statement/v1"' in result.payload
    with pytest.raises(VerificationError, match="Sigstore verification failed"):
        verify_sigstore_bundle(None, raw, identity="mallory@example.com", issuer=ACTIONS, trust=STAGING)
    # an artifact that is not one of the statement's subjects
    with pytest.raises(VerificationError, match="not a subject of the signed statement"):
        verify_sigstore_bundle((FIXTURES / "a.dsse.staging-rekor-v2.txt").read_bytes(), raw, identity=BEACON,
                               issuer=ACTIONS, trust=STAGING)


def test_duplicate_keys_in_a_real_bundle_are_refused() -> None:
    raw = (FIXTURES / "bundle.txt.sigstore").read_bytes()
    dup = raw.replace(b'"mediaType"', b'"mediaType": "x", "mediaType"', 1)
    assert dup != raw
    with pytest.raises(InputError, match="duplicate key 'mediaType'"):
        verify_sigstore_bundle((FIXTURES / "bundle.txt").read_bytes(), dup, identity="a@tny.town", issuer=GH, trust=STAGING)


def test_trusted_root_files_load() -> None:
    assert sigstore_verifier(SigstoreTrust(trusted_root=FIXTURES / "trusted_root_trustedroot.v1.json")) is not None
    assert sigstore_verifier(SigstoreTrust(trusted_root=FIXTURES / "tsa_trust_config.json")) is not None
    with pytest.raises(InputError, match="not a Sigstore trusted root"):
        sigstore_verifier(SigstoreTrust(trusted_root=FIXTURES / "bundle.txt.sigstore"))


@pytest.fixture
def release_with_real_dsse_bundle(tmp_path: Path) -> Path:
    """A release whose bundle is a real keyless Sigstore DSSE bundle, for another artifact."""
    root = tmp_path / "rel"
    make_release(root, entries=1, seed=7)
    shutil.copy(FIXTURES / DSSE_BUNDLE, root / attest.BUNDLE_NAME)
    return root


def test_release_verification_goes_through_sigstore_with_the_identity_policy(release_with_real_dsse_bundle: Path) -> None:
    root = release_with_real_dsse_bundle
    # the certificate, log inclusion and identity pass; the statement then is not a kvgraft release attestation
    with pytest.raises(VerificationError, match=re.escape("predicateType 'https://slsa.dev/provenance/v1' is not a kvgraft")):
        verify_result(root, SignedByIdentity(BEACON, ACTIONS, STAGING))
    # a wrong identity fails at the certificate, before the statement is looked at
    with pytest.raises(VerificationError, match="Sigstore verification failed") as info:
        verify_result(root, SignedByIdentity("mallory@example.com", ACTIONS, STAGING))
    assert attest.BUNDLE_NAME in info.value.diagnostics()
    # a keyless bundle checked with a key is refused, naming the right options
    from kvgraft.signing import keys

    _, public = keys.write_keypair(root.parent / "k")
    with pytest.raises(VerificationError, match="signed keyless with a Sigstore certificate"):
        verify_result(root, SignedWithKeys((public,)))


def test_cli_verify_with_identity_offline(release_with_real_dsse_bundle: Path) -> None:
    runner = CliRunner()
    root = str(release_with_real_dsse_bundle)
    common = ["verify", root, "--certificate-oidc-issuer", ACTIONS, "--staging", "--offline"]
    r = runner.invoke(app, [*common, "--certificate-identity", BEACON])
    assert r.exit_code == 1 and "predicateType" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, [*common, "--certificate-identity", "mallory@example.com"])
    assert r.exit_code == 1 and "Sigstore verification failed" in r.stderr and "mallory@example.com" in r.stderr
