"""One error base for the library; the CLI maps `exit_code` to the process status."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a check ran and failed: digest mismatch, bad signature, tampering
EXIT_INPUT = 2  # unusable input: missing/unreadable file, schema error, bad arguments
EXIT_MODEL = 3  # the model is not the one the release was made with
EXIT_NOT_EXACT = 4  # an audit completed and found a failure: states not byte-identical, or verdict FAILED
EXIT_EXISTS = 5  # refusing to overwrite an existing output
EXIT_INCOMPLETE = 6  # an audit ran but reached no verdict: nothing to judge, or a positive control missed its effect
EXIT_IO = 7  # the system refused a write: disk full, quota, I/O error, read-only or no permission
EXIT_BUSY = 8  # another process is writing the same output now
EXIT_DISAGREE = 9  # report compare: replications disagree beyond what their recorded conditions explain


# Digits of a number a message shows: a hostile file can state an integer of any length, and Python
# refuses to format one beyond 4,300 digits (and takes quadratic time below that).
MAX_DIGITS_SHOWN = 24


def short_int(n: int) -> str:
    """`n` for a message: in full up to MAX_DIGITS_SHOWN digits, else how many digits it has."""
    if -(10 ** MAX_DIGITS_SHOWN) < n < 10 ** MAX_DIGITS_SHOWN:
        return str(n)
    # Counted without str(n), the conversion to avoid: from the bit length, then one comparison.
    k = int(abs(n).bit_length() * 0.30102999566398120)
    digits = k + 1 if abs(n) >= 10**k else k
    return f"{'-' if n < 0 else ''}an integer of {digits} digits"


def short_repr(value: object, limit: int = 120) -> str:
    """repr() of a string or other value from a file, cut to `limit` characters (a name can be megabytes)."""
    text = repr(value[: limit + 1] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[:limit] + "..."


class Error(Exception):
    """Base of every error kvgraft raises on purpose."""

    exit_code = EXIT_INPUT
    # (folder, location) pairs: a local folder that stands for a location elsewhere (a release read over HTTP or
    # from S3 is read through such a folder), named by the location the person gave. Set on the error itself,
    # by the object that read the folder (kvgraft.release.sources.Source.name), never kept beside it.
    shown_as: tuple[tuple[str, str], ...] = ()

    def named(self, folder: str, location: str) -> Error:
        """This error, its messages naming `location` where they name `folder`."""
        if folder != location and (folder, location) not in self.shown_as:
            self.shown_as = (*self.shown_as, (folder, location))
        return self

    def diagnostics(self) -> str:
        """One line for a person: what is wrong and where."""
        text = str(self)
        for folder, location in self.shown_as:
            text = text.replace(folder, location)
        return text


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


class IOFailure(Error):
    """The system refused to write an output (ENOSPC, EDQUOT, EIO, EROFS, EACCES ...), nothing partial left; or
    failed a read (EIO: the device, not the input)."""

    exit_code = EXIT_IO


class BusyError(Error):
    """Another process holds the lock of the output being written."""

    exit_code = EXIT_BUSY
