"""Where a release is: a local folder, or an http(s)://, hf:// or s3:// location (docs/remote.md).

    https://host/path/REL                       a folder served over HTTP(S) (a Hub resolve/<revision>/ URL is one)
    hf://datasets/ORG/REPO@REVISION/path/REL    a folder of a Hugging Face Hub repository (models: hf://ORG/REPO...)
    s3://bucket/prefix/REL                      a prefix of an S3 bucket, on AWS or any S3-compatible endpoint
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit

from kvgraft.errors import InputError

SCHEMES = ("http://", "https://", "hf://", "s3://")
_ANY_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_PASSWORD = re.compile(r"(//[^/@:\s]*:)[^/@\s]*@")
HUB_TYPES = {"datasets": "dataset", "spaces": "space", "models": "model"}


@dataclass(frozen=True)
class Location:
    kind: str  # "http", "s3" or "hf"
    url: str  # as given, without a trailing slash and with any password hidden: what messages name
    bucket: str = ""  # s3
    prefix: str = ""  # s3: the key prefix; hf: the folder inside the repository
    repo_type: str = ""  # hf: "model", "dataset" or "space"
    repo_id: str = ""  # hf: ORG/REPO
    revision: str | None = None  # hf: a branch, tag or commit (None: the default branch)
    target: str = ""  # http: the URL to read, its password kept (`url` hides it)


def redact(text: str) -> str:
    """`text` with the password of any URL in it replaced by ***: an error line never shows it."""
    return _PASSWORD.sub(r"\1***@", text)


def is_remote(text: str) -> bool:
    """Whether `text` is a URL rather than a local path; a scheme kvgraft does not read (file://, ftp://) is
    refused here, so that it is never taken as a folder named `file:`."""
    if text.lower().startswith(SCHEMES):
        return True
    if _ANY_SCHEME.match(text):
        scheme = text.split(":", 1)[0]
        hint = " (give the folder's path instead)" if scheme.lower() == "file" else ""
        raise InputError(f"{redact(text)}: {scheme}:// locations are not read{hint}; a release is a folder or an "
                         f"http(s)://, hf:// or s3:// location")
    return False


def _split(text: str) -> SplitResult:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (raises on a port that is no number or out of range)
        (parts.hostname or "").encode("idna")  # raises on a name no DNS can hold (a label over 63 characters)
    except ValueError as exc:  # UnicodeError is one
        raise InputError(f"{redact(text)}: not a valid URL ({exc})") from None
    return parts


def parse(text: str) -> Location | None:
    """The location `text` names, or None for a local path."""
    if not is_remote(text):
        return None
    url = text.rstrip("/")
    parts = _split(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise InputError(f"{redact(text)}: no host in the URL")
        return Location("http", redact(url), target=url)
    if scheme == "s3":
        if not parts.netloc:
            raise InputError(f"{text}: expected s3://bucket/prefix")
        return Location("s3", url, bucket=parts.netloc, prefix=parts.path.strip("/"))
    return _hub(text, url)


def _hub(text: str, url: str) -> Location:
    rest = url[len("hf://"):]
    words = rest.split("/")
    repo_type = "model"
    if words and words[0] in HUB_TYPES:
        repo_type = HUB_TYPES[words.pop(0)]
    if len(words) < 2 or not words[0] or not words[1]:
        raise InputError(f"{text}: expected hf://datasets/ORG/REPO@REVISION/path (or hf://ORG/REPO... for a model)")
    org, name = words[0], words[1]
    revision = None
    if "@" in name:
        name, revision = name.split("@", 1)
        revision = unquote(revision)  # refs/pr/1 is written refs%2Fpr%2F1
        if not revision:
            raise InputError(f"{text}: an empty revision after '@'")
    return Location("hf", url, prefix="/".join(words[2:]), repo_type=repo_type, repo_id=f"{org}/{name}",
                    revision=revision)

