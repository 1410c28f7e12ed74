"""One error base for the library; the CLI maps `exit_code` to the process status."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a check ran and failed: digest mismatch, bad signature, tampering
EXIT_INPUT = 2  # unusable input: missing/unreadable file, schema error, bad arguments
EXIT_MODEL = 3  # the model is not the one the release was made with
EXIT_NOT_EXACT = 4  # an audit completed and found a failure: states not byte-identical, or verdict FAILED
EXIT_EXISTS = 5  # refusing to overwrite an existing output
EXIT_INCOMPLETE = 6  # an audit ran but reached no verdict: nothing to judge, or a positive control missed its effect


class Error(Exception):
    """Base of every error kvgraft raises on purpose."""

    exit_code = EXIT_INPUT

    def diagnostics(self) -> str:
        """One line for a person: what is wrong and where."""
        return str(self)


class InputError(Error):
    """Input that cannot be used: missing, unreadable, malformed, out of bounds."""


class SchemaError(InputError):
    """A JSON document does not match its schema."""

    def __init__(self, where: str, path: str, message: str) -> None:
        super().__init__(f"{where}: schema error at {path}: {message}")
        self.where = where
        self.path = path


class FormatVersionError(InputError):
    """A release or report of a format version this kvgraft does not read."""


class IntegrityError(Error):
    """Bytes that do not match their commitment."""

    exit_code = EXIT_FAILED


class VerificationError(Error):
    """A signature, identity or statement check failed."""

    exit_code = EXIT_FAILED


class ModelMismatchError(Error):
    """The loaded model's identity differs from the one a release was captured with."""

    exit_code = EXIT_MODEL


class ExistsError(Error):
    """An output already exists and overwriting was not asked for."""

    exit_code = EXIT_EXISTS
