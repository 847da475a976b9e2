"""A worker's local content-addressed blob cache: ``<data dir>/cache/<sha[:2]>/<sha>``.

A blob is downloaded to ``cache/tmp/`` while its sha256 is computed, and moved to its address
with one ``os.replace`` only when the digest matches; a mismatching or broken download is
deleted and raises :class:`CorruptDownload`. The cache is bounded (``max_bytes``): after each
download the least recently used blobs (oldest mtime; a hit touches the mtime, which works on
``noatime`` mounts too) are evicted until the total fits.

Concurrency, across threads and processes (slots of one worker, several workers sharing a
data dir): every digest has two lock files under ``cache/locks/``, used with ``flock``:

* ``<sha>.pin``: a reader holds it *shared* for as long as it may read the blob — the whole
  attempt (:meth:`BlobCache.close`, or the process's exit, releases it);
* ``<sha>.fetch``: a downloader holds it *exclusive* while it re-checks that the blob is
  missing, downloads and places it, so a second fetcher of the same digest waits for the
  first and then finds the file (one download);
* eviction takes ``<sha>.pin`` exclusive without waiting and skips a digest someone pins, so
  a blob in use by any attempt is never evicted. The bound can thus be exceeded while pinned
  blobs alone exceed it.

Lock files are empty and stay (deleting a lock file others may have open would break the
mutual exclusion).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from curvplan.types.artifacts import is_sha256

log = logging.getLogger("curvplan.worker.cache")

TEMP_MAX_AGE_SECONDS = 24 * 3600.0
"""Temp files older than this were left by a killed download and are removed at eviction."""

#: Receives the blob's bytes chunk by chunk (what a download writes into).
Sink = Callable[[bytes], None]
#: Fetches one blob: called with the digest and a sink; raises on a transfer failure.
Downloader = Callable[[str, Sink], None]


class CorruptDownload(Exception):
    """The downloaded bytes do not hash to the digest asked for (nothing was cached)."""


@dataclass(frozen=True)
class CachedBlob:
    path: Path
    size: int
    mtime: float


class BlobCache:
    """The cache under ``root``, bounded to ``max_bytes``; pins live until :meth:`close`."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.tmp_dir = self.root / "tmp"
        self.lock_dir = self.root / "locks"
        self._pins: dict[str, IO[bytes]] = {}

    def path_for(self, sha256: str) -> Path:
        """Where the blob ``sha256`` lives in the cache (whether or not it is there)."""
        if not is_sha256(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self.root / sha256[:2] / sha256

    # ------------------------------------------------------------------ reading
    def get(self, sha256: str, download: Downloader) -> Path:
        """The cached blob's path, downloaded first if missing; pinned until :meth:`close`.

        Raises :class:`CorruptDownload` (the temp file deleted) when the bytes do not match.
        """
        path = self.path_for(sha256)
        if sha256 in self._pins and path.is_file():
            _touch(path)
            return path
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        pin = open(self.lock_dir / f"{sha256}.pin", "ab")  # noqa: SIM115 (kept open: the pin)
        try:
            # Shared from here on: no eviction of this digest while the pin is held.
            fcntl.flock(pin, fcntl.LOCK_SH)
            if path.is_file():
                _touch(path)
            else:
                with open(self.lock_dir / f"{sha256}.fetch", "ab") as fetch:
                    fcntl.flock(fetch, fcntl.LOCK_EX)  # one download per digest at a time
                    if path.is_file():  # another fetcher placed it while we waited
                        _touch(path)
                    else:
                        self._download(sha256, path, download)
        except BaseException:
            pin.close()
            raise
        previous = self._pins.pop(sha256, None)
        self._pins[sha256] = pin
        if previous is not None:
            previous.close()
        self.evict()
        return path

    def _download(self, sha256: str, path: Path, download: Downloader) -> None:
        temp = self.tmp_dir / f"{sha256[:16]}-{secrets.token_hex(8)}"
        digest = hashlib.sha256()
        try:
            with open(temp, "xb") as fh:

                def sink(chunk: bytes) -> None:
                    digest.update(chunk)
                    fh.write(chunk)

                download(sha256, sink)
                fh.flush()
                os.fsync(fh.fileno())
            got = digest.hexdigest()
            if got != sha256:
                raise CorruptDownload(f"downloaded blob {sha256} hashes to {got}; discarded")
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)

    def close(self) -> None:
        """Release every pin (the blobs become evictable)."""
        pins, self._pins = self._pins, {}
        for lock in pins.values():
            lock.close()

    def __enter__(self) -> BlobCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ size bound
    def entries(self) -> list[CachedBlob]:
        """Every cached blob, least recently used first."""
        found = []
        for sub in self.root.glob("[0-9a-f][0-9a-f]"):
            for path in sub.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    st = path.stat()
                    found.append(CachedBlob(path, st.st_size, st.st_mtime))
        return sorted(found, key=lambda e: (e.mtime, e.path.name))

    def size(self) -> int:
        """Bytes the cached blobs take."""
        return sum(e.size for e in self.entries())

    def evict(self) -> list[str]:
        """Delete least recently used, unpinned blobs until the cache fits; their digests."""
        self._sweep_temp()
        entries = self.entries()
        total = sum(e.size for e in entries)
        evicted: list[str] = []
        for entry in entries:
            if total <= self.max_bytes:
                break
            sha256 = entry.path.name
            if sha256 in self._pins:
                continue
            with open(self.lock_dir / f"{sha256}.pin", "ab") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # pinned by another attempt (or being downloaded)
                entry.path.unlink(missing_ok=True)
            total -= entry.size
            evicted.append(sha256)
        if evicted:
            log.info("evicted %d blobs from the cache", len(evicted), extra={"bytes": total})
        return evicted

    def _sweep_temp(self) -> None:
        if not self.tmp_dir.is_dir():
            return
        cutoff = time.time() - TEMP_MAX_AGE_SECONDS
        for temp in self.tmp_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if temp.stat().st_mtime < cutoff:
                    temp.unlink()


def _touch(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)
