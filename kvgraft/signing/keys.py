"""Signing keys for offline release attestations: generate, store as PEM, load, sign, verify.

Two algorithms are generated: ECDSA P-256 with SHA-256 (the default; the same curve Sigstore uses, so
Sigstore tooling can check a key-signed bundle) and Ed25519. Keys made elsewhere on the other curves
OpenSSF model signing allows, P-384 and P-521, are read too; the hash follows the curve (SHA-384,
SHA-512), as OMS and Sigstore define it. Private keys are PKCS#8 PEM, encrypted with the
passphrase when one is given (the best available PEM encryption of `cryptography`); public keys are
SubjectPublicKeyInfo PEM. ECDSA signatures are DER encoded, Ed25519 signatures are the raw 64 bytes.

A key has one id everywhere (`key_id`: keygen, sign, verify, inspect, the "hint" a bundle names it by): the
lowercase hex SHA-256 of its SubjectPublicKeyInfo PEM, the fingerprint OpenSSF model signing writes as
model.sig's hint and checks. Bundles signed before used the SHA-256 of the DER form as their hint
(`der_fingerprint`); a hint of that form is still accepted for the key it names.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import Error, InputError

ALGORITHMS = ("ecdsa-p256", "ed25519")
DEFAULT_ALGORITHM = "ecdsa-p256"
MAX_KEY_BYTES = 64 * 1024

# The ECDSA curves OMS v1.0 (model_signing) and Sigstore's key specs allow, with the hash each signs with.
CURVES: dict[str, hashes.HashAlgorithm] = {"secp256r1": hashes.SHA256(), "secp384r1": hashes.SHA384(),
                                           "secp521r1": hashes.SHA512()}
_CURVE_NAMES = {"secp256r1": "p256", "secp384r1": "p384", "secp521r1": "p521"}

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class EncryptedKeyError(InputError):
    """A private key is encrypted and no passphrase was given."""


def generate(algorithm: str = DEFAULT_ALGORITHM) -> PrivateKey:
    """A new private key: "ecdsa-p256" (default) or "ed25519"."""
    if algorithm == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if algorithm == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise InputError(f"--algorithm {algorithm!r}: not supported; choose one of {', '.join(ALGORITHMS)}")


def algorithm_of(key: PrivateKey | PublicKey) -> str:
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "ed25519"
    return f"ecdsa-{_CURVE_NAMES.get(key.curve.name, key.curve.name)}"


def private_pem(key: PrivateKey, passphrase: bytes | None = None) -> bytes:
    """PKCS#8 PEM; encrypted with `passphrase` when it is given and not empty."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _public(key: PrivateKey | PublicKey) -> PublicKey:
    return key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) else key


def public_pem(key: PrivateKey | PublicKey) -> bytes:
    return _public(key).public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


KEY_ID_IS = "SHA-256 of the public key PEM"  # what a key id shown to a person is the fingerprint of


def key_id(key: PrivateKey | PublicKey) -> str:
    """The key id: lowercase hex SHA-256 of the public key's SubjectPublicKeyInfo PEM (module docstring)."""
    return sha256_hex(public_pem(key))


def der_fingerprint(key: PrivateKey | PublicKey) -> str:
    """Hex SHA-256 of the DER SubjectPublicKeyInfo: the hint kvgraft wrote before key ids were `key_id`."""
    return sha256_hex(_public(key).public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def write_keypair(prefix: Path, *, algorithm: str = DEFAULT_ALGORITHM, passphrase: bytes | None = None,
                  overwrite: bool = False) -> tuple[Path, Path]:
    """Write PREFIX.key.pem (mode 0600) and PREFIX.pub.pem atomically; return both paths."""
    prefix = Path(prefix)
    private_path = prefix.with_name(prefix.name + ".key.pem")
    public_path = prefix.with_name(prefix.name + ".pub.pem")
    for path in (private_path, public_path):
        jsonio.refuse_existing(path, overwrite)
    key = generate(algorithm)
    # Two files cannot be replaced in one step. The old public key is removed first, so that a kill in
    # between leaves a private key without a public one, never beside the public key of another pair (one a
    # user would publish); a refused write puts the previous pair back (or removes the new files where there
    # was none).
    before = {path: jsonio.read_bounded(path, MAX_KEY_BYTES, "a PEM key") if path.is_file() else None
              for path in (private_path, public_path)}
    with jsonio.writing(public_path):
        public_path.unlink(missing_ok=True)
    try:
        _write_secret(private_path, private_pem(key, passphrase))
        jsonio.write_atomic(public_path, public_pem(key))
    except BaseException:
        for path, data in before.items():
            with contextlib.suppress(OSError, Error):
                if data is None:
                    path.unlink(missing_ok=True)
                else:
                    jsonio.write_atomic(path, data, mode=0o600 if path == private_path else 0o644)
        raise
    return private_path, public_path


def _write_secret(path: Path, data: bytes) -> None:
    """Atomic write of a file that is 0600 from its creation on (mkstemp creates it 0600)."""
    jsonio.write_atomic(path, data, mode=0o600)


def _read_pem(path: Path, what: str) -> bytes:
    """A key file's bytes: a regular file of at most MAX_KEY_BYTES, checked before it is read (a device such
    as /dev/zero reports size 0 and never ends; a FIFO blocks its reader until a writer comes)."""
    return jsonio.read_bounded(Path(path), MAX_KEY_BYTES, f"a {what}")


def is_encrypted(path: Path) -> bool:
    return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in _read_pem(path, "private key")


def load_private_key(path: Path, passphrase: bytes | None = None) -> PrivateKey:
    """Load a PEM private key (ECDSA P-256 or Ed25519), decrypting it with `passphrase`."""
    data = _read_pem(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=passphrase or None)
    except TypeError:
        if passphrase:
            raise InputError(f"{path}: the key is not encrypted but a passphrase was given") from None
        raise EncryptedKeyError(f"{path}: the private key is encrypted; give its passphrase") from None
    except ValueError as exc:
        if b"ENCRYPTED" in data and passphrase:
            raise InputError(f"{path}: cannot decrypt the private key (wrong passphrase?)") from None
        raise InputError(f"{path}: not a PEM private key ({' '.join(str(exc).split())})") from None
    except UnsupportedAlgorithm as exc:
        raise InputError(f"{path}: unsupported key: {exc}") from None
    return _supported_private(key, path)


def load_public_key(path: Path) -> PublicKey:
    """Load a PEM public key (SubjectPublicKeyInfo): ECDSA P-256, P-384 or P-521, or Ed25519."""
    data = _read_pem(path, "public key")
    if b"PRIVATE KEY" in data:
        raise InputError(f"{path}: is a private key; verify with the public key (.pub.pem)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InputError(f"{path}: not a PEM public key ({' '.join(str(exc).split())})") from None
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in CURVES:
        return key
    raise InputError(f"{path}: unsupported public key type; kvgraft uses ECDSA P-256, P-384 or P-521, or Ed25519")


def _supported_private(key: object, path: Path) -> PrivateKey:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in CURVES:
        return key
    raise InputError(f"{path}: unsupported private key type; kvgraft signs with ECDSA P-256, P-384 or P-521, "
                     f"or Ed25519")


def sign(key: PrivateKey, data: bytes) -> bytes:
    """ECDSA (DER; SHA-256, -384 or -512 by curve) or Ed25519 signature over `data`."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    return key.sign(data, ec.ECDSA(CURVES[key.curve.name]))


def verify(key: PublicKey, signature: bytes, data: bytes) -> bool:
    """True when `signature` over `data` verifies with `key`."""
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            key.verify(signature, data, ec.ECDSA(CURVES[key.curve.name]))
    except InvalidSignature:
        return False
    return True
