"""`kvgraft inspect --json`: what a release holds, read from its manifest alone (schemas/inspect-result.v1.json).

Three documents: a listing (header, signature files, a page of entries), one entry in detail, or a refusal (the
release could not be read). A member that may be absent is left unset and absent from the JSON (`as_json`
drops what was never set, never what was set to null: an entry's answer may be null); so every member that is
always written, constants included, is set by whoever makes the document.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from kvgraft.results.base import Count, JsonObject, Open, Sha256


class Document(Open):
    def as_json(self) -> JsonObject:
        """The document as `--json` prints it: the members set, in the order the schema lists them."""
        return self.model_dump(mode="json", exclude_unset=True)


class Row(Document):
    """One line of the entries table."""

    id: str
    num_tokens: Annotated[int, Field(ge=1)]
    bytes: Count = Field(description="The entry file's size, as the manifest lists it.")
    tensor_bytes: Count
    source_kind: Literal["text", "messages"]
    preview: str = Field(description="The first words of the text (a chat: of its first message, after its role).")


class Tensor(Document):
    name: str
    dtype: str
    shape: list[int]
    byte_range: list[int]
    bytes: Count
    sha256: Sha256


class EntrySource(Document):
    kind: Literal["text", "messages"]
    sha256: str
    text: str | None = None
    truncated: bool | None = None
    messages: Count | None = None


class Detail(Row):
    """One entry in full: its file, layers, tensors (dtype, shape, bytes, digest), tokens and source."""

    file: str
    file_sha256: Sha256
    digest: Sha256
    token_ids_sha256: str
    token_ids_head: list[int]
    source: EntrySource
    next_token: JsonObject
    probe_tokens: Count
    layers: list[JsonObject] = Field(description="The first 1,024 layers (layers_total counts them all); strings cut "
                                     "at 200 characters.")
    layers_total: Count
    tensors: list[Tensor] = Field(description="The first 1,024 tensors by position in the file (tensors_total counts "
                                  "them all).")
    tensors_total: Count
    answer: JsonValue = None
    answer_truncated: bool | None = Field(default=None, description="The answer (a string) was cut at 2,000 characters, as "
                                          "the text is.")
    meta: JsonValue = None


class Certificate(Document):
    """When the certificate was valid (no member: it could not be read, and the signature's problem says why)."""

    not_before: str | None = None
    not_after: str | None = None


class Signature(Document):
    """A signature file beside the data, parsed to name its signer; never verified."""

    file: str
    what: str
    verified: Literal[False]
    bytes: Count | None = None
    method: Literal["key", "sigstore"] | None
    signer: str | None = Field(description="The key id (hint) or the certificate's identities, as the file names "
                               "them: not checked.")
    issuer: str | None = None
    certificate: Certificate | None = None
    transparency_log_entries: Count | None = None
    statement_root_digest: str | None = None
    names_this_manifest: bool | None = None
    problem: str | None = Field(default=None, description="Why the file could not be read (then method and signer are null), "
                                "or the certificate it carries.")


class ReleaseFormat(Document):
    format: str
    version: int
    kvgraft_version: str


class Page(Document):
    total: Count
    offset: Count
    shown: Count
    rows: list[Row]


class Head(Document):
    """What every inspection of a readable release says first: nothing was verified."""

    format: Literal["kvgraft-inspect-result"]
    format_version: Literal[1]
    kvgraft_version: str
    release: str
    verified: Literal[False]
    note: str


class Listing(Head):
    """The release's header (each member cut to a bounded size), its signature files and a page of its entries."""

    release_format: ReleaseFormat
    created: str
    model: JsonObject
    schedule: JsonObject
    root_digest: Sha256
    environment: JsonObject
    files: Count
    signatures: list[Signature]
    entries: Page


class EntryInspection(Head):
    """One entry in detail, with the release it belongs to named."""

    root_digest: Sha256
    entry: Detail


class Refusal(Document):
    """A release that could not be inspected: the one line printed on stderr, and the exit status."""

    format: Literal["kvgraft-inspect-result"]
    format_version: Literal[1]
    kvgraft_version: str
    release: str
    ok: Literal[False]
    exit_code: int  # any status the refusal had: the document is written whatever the error was
    error: str


__all__ = ["Certificate", "Detail", "EntryInspection", "EntrySource", "Listing", "Page", "Refusal", "ReleaseFormat",
           "Row", "Signature", "Tensor"]
