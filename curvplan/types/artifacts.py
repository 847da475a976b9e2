"""Request and response models of the artifact resource (docs/openapi.json)."""

from __future__ import annotations

import os
import re
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TensorSummary(BaseModel):
    dtype: str
    shape: list[int]


class ArtifactLinks(BaseModel):
    self: str
    content: str | None = None
    tensors: str | None = Field(default=None, description="Every tensor, paged.")
    metadata: str | None = Field(default=None, description="Every metadata entry, paged.")


class TensorEntry(BaseModel):
    name: str
    dtype: str
    shape: list[int]


class MetadataEntry(BaseModel):
    key: str
    value: str


class MetadataPage(BaseModel):
    """A page of an artifact's safetensors ``__metadata__``, by key (byte order), in full."""

    items: list[MetadataEntry]
    next_page_token: str | None


class TensorPage(BaseModel):
    """A page of an artifact's tensors, by name (byte order)."""

    items: list[TensorEntry]
    next_page_token: str | None


class ArtifactOut(BaseModel):
    """An artifact as the API returns it."""

    id: uuid.UUID
    kind: Literal["checkpoint", "dataset", "job-output"]
    name: str | None
    storage: Literal["blob", "uri"]
    sha256: str | None = Field(description="Hex digest of the bytes (null for a uri not yet read).")
    size: int | None = Field(description="Bytes (null for a uri not yet read).")
    uri: str | None
    tensor_count: int | None = Field(
        default=None, description="Tensors in the file (null for a uri not yet read)."
    )
    tensors: dict[str, TensorSummary] | None = Field(
        description="Name → dtype and shape of the first tensors by name "
        "(CURVPLAN_ARTIFACT_TENSOR_PREVIEW, 100 by default); every one: links.tensors."
    )
    tensors_truncated: bool = Field(
        default=False, description="Whether the file has more tensors than `tensors` lists."
    )
    metadata: dict[str, str] | None = Field(
        description="The first entries of the safetensors __metadata__ by key (20), each value "
        "cut to 200 characters; every entry in full: links.metadata (null for a uri not yet "
        "read)."
    )
    metadata_count: int | None = Field(
        default=None, description="Entries of the __metadata__ (null for a uri not yet read)."
    )
    metadata_truncated: bool = Field(
        default=False,
        description="Whether `metadata` leaves entries out or cuts a value (read them in "
        "full from links.metadata).",
    )
    job_id: uuid.UUID | None = Field(description="The job that wrote it (job outputs).")
    created_at: datetime
    links: ArtifactLinks


class ArtifactPage(BaseModel):
    items: list[ArtifactOut]
    next_page_token: str | None


class ArtifactUriCreate(BaseModel):
    """Register a safetensors file that already lives where the workers can read it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["checkpoint", "dataset"]
    uri: Annotated[str, Field(min_length=8, max_length=4096)] = Field(
        description="file:///absolute/path.safetensors (validated when a job first reads it)."
    )
    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None

    @field_validator("uri", "name")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        # PostgreSQL text holds neither U+0000 nor an unpaired surrogate (JSON carries both).
        if value is None:
            return value
        try:
            value.encode("utf-8")  # fails on an unpaired surrogate
        except UnicodeEncodeError:
            raise ValueError("must not contain unpaired surrogate characters") from None
        if "\x00" in value:
            raise ValueError("must not contain the NUL character")
        return value

    @field_validator("uri")
    @classmethod
    def _file_uri(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "file":
            raise ValueError(
                f"only file:// URIs are supported, not {parts.scheme or 'a bare path'!r}"
            )
        if parts.netloc not in ("", "localhost"):
            raise ValueError("a file:// URI names a local path: file:///absolute/path")
        path = unquote(parts.path)
        if not path.startswith("/") or "\x00" in path:
            raise ValueError("a file:// URI needs an absolute path: file:///absolute/path")
        if any(segment == ".." for segment in path.split("/")):
            raise ValueError("the path must not contain '..' segments")
        return value


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(value: str) -> bool:
    """Whether ``value`` is a sha256 digest as blobs are named: 64 lowercase hex digits."""
    return _SHA256_HEX.match(value) is not None


def uri_path(uri: str) -> str:
    """The local path of a validated ``file://`` URI."""
    return unquote(urlsplit(uri).path)


def uri_allowed(uri: str, roots: list[Path]) -> bool:
    """Whether a ``file://`` URI's path lies under one of ``roots`` (none when empty).

    Secure by default: without configured roots no path is allowed. Symlinks are
    resolved on both sides, so a link under a root cannot point outside it.
    """
    if not roots:
        return False
    path = Path(os.path.realpath(uri_path(uri)))
    return any(path.is_relative_to(os.path.realpath(root)) for root in roots)
