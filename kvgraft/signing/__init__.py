"""Signatures: keys, in-toto statements in DSSE envelopes (Sigstore bundles), OpenSSF model signing. Imports no torch."""
