"""Signing: keys, in-toto statements in DSSE envelopes (Sigstore bundles), OpenSSF model signing, signing a release
and verifying one under a policy. Imports no torch."""
