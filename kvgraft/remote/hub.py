"""hf:// locations through the Hub's own client library: the revision pinned to a commit, the token, the URLs.

`hf://datasets/ORG/REPO@REVISION/path` is resolved once, when the release is opened, to the commit its
revision names (`HfApi.resolve_revision`): every file is then read at that commit, so a branch that moves
while a release is read cannot mix two versions. The files are read over HTTP (kvgraft.remote.store) at
the Hub's `resolve/<commit>/` URLs (`hf_hub_url`), with the headers the library builds (the token from
HF_TOKEN or `hf auth login`); the endpoint is HF_ENDPOINT's, and HF_HUB_OFFLINE refuses the location.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from kvgraft.remote.location import Location
from kvgraft.remote.store import FetchError, HttpStore, Settings, Store


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise FetchError("reading an hf:// location needs huggingface_hub: pip install 'kvgraft[remote]'") from None
    return huggingface_hub


def headers_for(url: str) -> dict[str, str]:
    """The Hub's headers (its token) for a URL on the Hub's own host; none for any other host."""
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]
    except ImportError:
        return {}
    if urlsplit(url).hostname != urlsplit(constants.ENDPOINT).hostname:
        return {}
    return {k: v for k, v in build_hf_headers().items() if k.lower() == "authorization"}


class HubStore(HttpStore):
    """A folder of a Hub repository at one commit, read at its resolve/<commit>/ URLs."""

    def __init__(self, loc: Location, commit: str, endpoint: str, headers: dict[str, str], settings: Settings) -> None:
        super().__init__(endpoint, display=loc.url, headers=headers, settings=settings)
        self.loc, self.commit, self.endpoint = loc, commit, endpoint

    def url(self, name: str) -> str:
        from huggingface_hub import hf_hub_url

        path = f"{self.loc.prefix}/{name}" if self.loc.prefix else name
        return str(hf_hub_url(self.loc.repo_id, path, repo_type=self.loc.repo_type, revision=self.commit,
                              endpoint=self.endpoint))


def open_store(loc: Location, settings: Settings) -> tuple[Store, list[str]]:
    hub = _hub()
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    if constants.is_offline_mode():
        raise FetchError(f"{loc.url}: HF_HUB_OFFLINE is set; an hf:// location is read from the Hub")
    endpoint = constants.ENDPOINT.rstrip("/")
    api = hub.HfApi(endpoint=endpoint)
    try:
        if hasattr(api, "resolve_revision"):  # where the library has it: made for pinning a revision once
            commit = str(api.resolve_revision(loc.repo_id, repo_type=loc.repo_type, revision=loc.revision).resolved)
        else:
            commit = str(api.repo_info(loc.repo_id, repo_type=loc.repo_type, revision=loc.revision).sha)
    except Exception as exc:  # the library's errors: repository or revision not found, no connection
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FetchError(f"{loc.url}: the Hub cannot resolve {loc.repo_type} {loc.repo_id} at revision "
                         f"{loc.revision or 'main'}: {first}") from None
    headers = {k: v for k, v in build_hf_headers().items() if k.lower() == "authorization"}
    note = [] if loc.revision == commit else [f"{loc.url}: revision {loc.revision or 'main'} is commit {commit}; every "
                                              f"file was read at that commit"]
    return HubStore(loc, commit, endpoint, headers, settings), note
