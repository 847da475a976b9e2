"""The worker's side of ``/v1/worker/blobs``: download a blob by sha256, upload an output.

Synchronous httpx with a connect/read timeout (``CURVPLAN_WORKER_HTTP_TIMEOUT_SECONDS``) and
two retries of a failed connection (httpx's transport retries: connect errors only, so a
request is never sent twice). A transfer that still fails raises :class:`BlobTransferError`,
which fails the attempt as a *retryable* error (the job is queued again with backoff); a blob
the API does not have raises :class:`BlobNotOnServer`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import httpx

from curvplan_worker.blobs.cache import Sink
from curvplan_worker.errors import RetryableError

CONNECT_RETRIES = 2
CHUNK_BYTES = 1 << 20


class BlobTransferError(RetryableError):
    """The API could not be reached, or answered a transfer with an unexpected error."""


class BlobNotOnServer(Exception):
    """The API's store does not hold the blob (404)."""


class BlobApi:
    """Blob transfers with the API at ``base_url``, authenticated with a worker key."""

    def __init__(
        self, base_url: str, key: str, timeout: float, client: httpx.Client | None = None
    ) -> None:
        """``client``: an httpx client to send through instead (an in-process test app)."""
        self.base_url = base_url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {key}"}
        self._client = client or httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            transport=httpx.HTTPTransport(retries=CONNECT_RETRIES),
            follow_redirects=False,
        )

    def download(self, sha256: str, sink: Sink) -> None:
        """Stream blob ``sha256`` into ``sink`` (the cache hashes what it receives)."""
        try:
            with self._client.stream(
                "GET", f"/v1/worker/blobs/{sha256}", headers=self._auth
            ) as response:
                if response.status_code == 404:
                    raise BlobNotOnServer(f"the API's store has no blob {sha256}")
                _raise_for(response, f"download of blob {sha256}")
                for chunk in response.iter_bytes(CHUNK_BYTES):
                    sink(chunk)
        except httpx.HTTPError as exc:
            raise BlobTransferError(
                f"download of blob {sha256} from {self.base_url} failed: {_describe(exc)}"
            ) from None

    def exists(self, sha256: str) -> bool:
        """Whether the API's store holds blob ``sha256`` now (``HEAD``)."""
        try:
            response = self._client.head(f"/v1/worker/blobs/{sha256}", headers=self._auth)
            if response.status_code == 404:
                return False
            _raise_for(response, f"check of blob {sha256}")
            return True
        except httpx.HTTPError as exc:
            raise BlobTransferError(
                f"check of blob {sha256} at {self.base_url} failed: {_describe(exc)}"
            ) from None

    def upload(self, path: Path, sha256: str) -> None:
        """PUT the file at ``path`` as blob ``sha256`` (the API verifies the digest)."""
        try:
            with open(path, "rb") as fh:
                response = self._client.put(
                    f"/v1/worker/blobs/{sha256}",
                    content=_chunks(fh),
                    headers={
                        **self._auth,
                        "Content-Type": "application/octet-stream",
                        "Content-Length": str(path.stat().st_size),
                    },
                )
            _raise_for(response, f"upload of blob {sha256}")
        except httpx.HTTPError as exc:
            raise BlobTransferError(
                f"upload of blob {sha256} to {self.base_url} failed: {_describe(exc)}"
            ) from None

    def close(self) -> None:
        self._client.close()


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    while chunk := fh.read(CHUNK_BYTES):
        yield chunk


def _raise_for(response: httpx.Response, what: str) -> None:
    if response.status_code < 400:
        return
    response.read()
    try:
        detail = response.json().get("detail") or response.text
    except ValueError:
        detail = response.text
    raise BlobTransferError(f"{what}: the API answered {response.status_code}: {detail[:200]}")


def _describe(exc: httpx.HTTPError) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
