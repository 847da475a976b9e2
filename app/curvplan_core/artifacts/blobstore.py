"""Content-addressed blob store on a directory (README.md).

Layout under ``root`` (``$CURVPLAN_DATA_DIR/blobs`` by default)::

    tmp/<random>                 uploads in flight (deleted on any failure)
    sha256/ab/cdef…              committed blobs, named by their sha256 hex digest

A blob is written to ``tmp/`` while it is hashed and validated, then moved into place
with one ``os.replace`` (atomic on one filesystem), so a reader never sees half a blob.
Identical content is stored once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from curvplan.types.artifacts import is_sha256
from curvplan_core.artifacts.safetensors_format import (
    MAX_HEADER_BYTES,
    MAX_METADATA_BYTES,
    MAX_TENSORS,
    SafetensorsInfo,
    SafetensorsValidator,
    check_file,
)


class BlobTooLarge(Exception):
    """The blob grew past the store's size limit while it streamed in."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the file exceeds the limit of {limit} bytes")
        self.limit = limit


class TempFileGone(Exception):
    """The upload's temp file vanished before it was placed: the temp-file sweeper removed it
    (an upload stalled longer than ``CURVPLAN_TEMP_FILE_MAX_AGE_SECONDS``)."""


class BlobStore:
    """A directory of immutable blobs addressed by sha256."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tmp_dir = self.root / "tmp"
        self.blob_dir = self.root / "sha256"

    def ensure(self) -> None:
        """Create the directories (idempotent)."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.blob_dir.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        """Where the blob with this digest lives (whether or not it exists)."""
        if not is_sha256(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self.blob_dir / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def writer(
        self,
        max_bytes: int | None = None,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_tensors: int = MAX_TENSORS,
        max_metadata_bytes: int = MAX_METADATA_BYTES,
    ) -> BlobWriter:
        """A writer for one new blob (validated as safetensors while it streams)."""
        self.ensure()
        return BlobWriter(
            self, max_bytes, SafetensorsValidator(max_header_bytes, max_tensors, max_metadata_bytes)
        )

    def commit_temp(self, temp_path: Path, sha256: str) -> Path:
        """Move a fully written temp file to its content address (dedupe: keep the first)."""
        dest = self.path_for(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_file():
            temp_path.unlink(missing_ok=True)
            return dest
        try:
            os.replace(temp_path, dest)
        except FileNotFoundError:
            raise TempFileGone(str(temp_path)) from None
        return dest

    def delete(self, sha256: str) -> None:
        """Remove a blob (callers check first that no artifact row references it)."""
        self.path_for(sha256).unlink(missing_ok=True)

    def temp_files(self) -> list[Path]:
        """Uploads in flight or left behind (tests assert none remain after a failure)."""
        return sorted(self.tmp_dir.glob("*")) if self.tmp_dir.exists() else []

    def blobs(self) -> list[str]:
        """Every committed digest (for tests and garbage collection)."""
        if not self.blob_dir.exists():
            return []
        return sorted(p.parent.name + p.name for p in self.blob_dir.glob("*/*") if p.is_file())


class BlobWriter:
    """Streams one blob into ``tmp/``: writes, hashes and validates each chunk as it comes.

    Use :meth:`write` for each chunk, then :meth:`finish` (validates the end of the file
    and returns the digest and the safetensors summary), then :meth:`commit`; or
    :meth:`abort` on any failure, which deletes the temp file. Memory use is one chunk
    plus the safetensors header.
    """

    def __init__(
        self, store: BlobStore, max_bytes: int | None, validator: SafetensorsValidator | None = None
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.temp_path = store.tmp_dir / f"upload-{secrets.token_hex(12)}"
        self._fh: BinaryIO | None = open(self.temp_path, "xb")  # noqa: SIM115 (closed in finish/abort)
        self._hash = hashlib.sha256()
        self._validator = validator or SafetensorsValidator()
        #: The streaming check (its ``on_header_length`` hook sees the header's length first).
        self.validator = self._validator
        self.size = 0
        self.sha256: str | None = None
        self.info: SafetensorsInfo | None = None
        #: Called once with (header, declared file size) as soon as the header has arrived,
        #: before its chunk is stored; what it raises aborts the upload there.
        self.on_header: Callable[[SafetensorsInfo, int], None] | None = None
        self._header_seen = False

    def write(self, chunk: bytes) -> None:
        """Append a chunk; raises BlobTooLarge or InvalidSafetensors as soon as it is provable."""
        if not chunk:
            return
        assert self._fh is not None, "writer is closed"
        self.size += len(chunk)
        if self.max_bytes is not None and self.size > self.max_bytes:
            raise BlobTooLarge(self.max_bytes)
        self._validator.feed(chunk)
        if self.on_header is not None and not self._header_seen:
            header = self._validator.header
            if header is not None:
                self._header_seen = True
                self.on_header(header, self._validator.declared_bytes)
        self._hash.update(chunk)
        self._fh.write(chunk)

    def finish(self) -> SafetensorsInfo:
        """Close the file after checking it is a complete safetensors file (the early
        check's size, then the ``safetensors`` library on the stored bytes)."""
        info = self._validator.finish()
        assert self._fh is not None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        try:
            check_file(self.temp_path)
        except FileNotFoundError:
            raise TempFileGone(str(self.temp_path)) from None
        self.info = info
        self.sha256 = self._hash.hexdigest()
        return self.info

    def commit(self) -> Path:
        """Move the finished blob to its content address; returns its path."""
        if self.sha256 is None:
            raise RuntimeError("finish() the blob before committing it")
        return self.store.commit_temp(self.temp_path, self.sha256)

    def abort(self) -> None:
        """Forget the blob: close and delete the temp file (safe to call twice)."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        self.temp_path.unlink(missing_ok=True)


def default_store(data_dir: Path) -> BlobStore:
    """The store under a data directory (``$CURVPLAN_DATA_DIR/blobs``)."""
    return BlobStore(Path(data_dir) / "blobs")
