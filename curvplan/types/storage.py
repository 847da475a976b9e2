"""Storage usage and quota of a project (``GET /v1/storage``; the quota problems carry both)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StorageAmounts(BaseModel):
    """Bytes and number of artifacts (null in a quota: no limit)."""

    bytes: int | None = Field(description="Bytes of uploaded artifacts.")
    artifacts: int | None = Field(description="Uploaded and registered artifacts.")


class StorageUsage(BaseModel):
    """What the project stores (uploads and registrations; job outputs are not counted) and
    its limits."""

    usage: StorageAmounts
    quota: StorageAmounts


class WorkerBlobOut(BaseModel):
    """A blob a worker uploaded (``PUT /v1/worker/blobs/{sha256}``)."""

    sha256: str = Field(description="The blob's sha256 hex digest (its address).")
    size_bytes: int = Field(description="Its size in bytes.")
    created: bool = Field(description="False when the store already held this content.")
