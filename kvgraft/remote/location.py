"""Where a release is: a local folder, or an http(s)://, hf:// or s3:// location (docs/remote.md).

    https://host/path/REL                       a folder served over HTTP(S) (a Hub resolve/<revision>/ URL is one)
    hf://datasets/ORG/REPO@REVISION/path/REL    a folder of a Hugging Face Hub repository (models: hf://ORG/REPO...)
    s3://bucket/prefix/REL                      a prefix of an S3 bucket, on AWS or any S3-compatible endpoint
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from kvgraft.errors import InputError

SCHEMES = ("http://", "https://", "hf://", "s3://")
HUB_TYPES = {"datasets": "dataset", "spaces": "space", "models": "model"}


@dataclass(frozen=True)
class Location:
    kind: str  # "http", "s3" or "hf"
    url: str  # as given, without a trailing slash: what messages name
    bucket: str = ""  # s3
    prefix: str = ""  # s3: the key prefix; hf: the folder inside the repository
    repo_type: str = ""  # hf: "model", "dataset" or "space"
    repo_id: str = ""  # hf: ORG/REPO
    revision: str | None = None  # hf: a branch, tag or commit (None: the default branch)


def is_remote(text: str) -> bool:
    return text.lower().startswith(SCHEMES)


def parse(text: str) -> Location | None:
    """The location `text` names, or None for a local path."""
    if not is_remote(text):
        return None
    url = text.rstrip("/")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.netloc:
            raise InputError(f"{text}: no host in the URL")
        return Location("http", url)
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

