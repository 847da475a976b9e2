"""The remote worker's blob cache (curvplan_worker.blobs.cache): verified downloads, LRU
eviction within a size bound, pins, and one download when two fetchers want one digest."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from curvplan_worker.blobs.cache import BlobCache, CorruptDownload, Sink


def blob(n: int, size: int = 1000) -> tuple[str, bytes]:
    data = bytes([n % 256]) * size
    return hashlib.sha256(data).hexdigest(), data


def server(blobs: dict[str, bytes], calls: list[str]) -> Callable[[str, Sink], None]:
    """A downloader serving ``blobs`` in small chunks and recording each call."""

    def download(sha256: str, sink: Sink) -> None:
        calls.append(sha256)
        data = blobs[sha256]
        for i in range(0, len(data), 256):
            sink(data[i : i + 256])

    return download


def age(path: Path, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(path, (when, when))


def test_a_download_is_verified_cached_and_served_from_the_cache_afterwards(tmp_path):
    sha, data = blob(1)
    calls: list[str] = []
    with BlobCache(tmp_path / "cache", 10_000) as cache:
        path = cache.get(sha, server({sha: data}, calls))
        assert path == tmp_path / "cache" / sha[:2] / sha
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    with BlobCache(tmp_path / "cache", 10_000) as cache:
        assert cache.get(sha, server({sha: data}, calls)) == path
    assert calls == [sha]  # the second attempt found it
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


def test_a_mismatching_download_is_rejected_and_leaves_nothing(tmp_path):
    sha, _ = blob(1)
    _, other = blob(2)
    with BlobCache(tmp_path / "cache", 10_000) as cache:
        with pytest.raises(CorruptDownload, match=sha):
            cache.get(sha, server({sha: other}, []))
        assert not cache.path_for(sha).exists()
        assert cache.entries() == []
        assert list(cache.tmp_dir.iterdir()) == []

        # A truncated transfer too: the temp file goes, the error propagates.
        def broken(sha256: str, sink: Sink) -> None:
            sink(b"partial")
            raise ConnectionError("reset by peer")

        with pytest.raises(ConnectionError):
            cache.get(sha, broken)
        assert not cache.path_for(sha).exists() and list(cache.tmp_dir.iterdir()) == []


def test_eviction_removes_the_least_recently_used_blobs_down_to_the_bound(tmp_path):
    blobs = dict(blob(n) for n in range(4))
    a, b, c, d = blobs
    root = tmp_path / "cache"
    for i, sha in enumerate((a, b, c)):  # each attempt pins its blob until it ends
        with BlobCache(root, 3_000) as cache:
            age(cache.get(sha, server(blobs, [])), 300 - 100 * i)  # a oldest, then b, c
    with BlobCache(root, 3_000) as cache:  # a hit makes a the most recently used
        path_a = cache.get(a, server(blobs, []))
        assert path_a.stat().st_mtime > cache.path_for(c).stat().st_mtime
        age(path_a, 50)  # (deterministic order against d, downloaded next)
    with BlobCache(root, 3_000) as cache:
        cache.get(d, server(blobs, []))  # 4 blobs > 3 000 bytes: b goes
        assert [e.path.name for e in cache.entries()] == [c, a, d]
        assert cache.size() <= 3_000
    with BlobCache(root, 1_000) as cache:  # a smaller bound keeps only the newest
        cache.evict()
        assert [e.path.name for e in cache.entries()] == [d]


def test_a_blob_pinned_by_another_attempt_is_never_evicted(tmp_path):
    blobs = dict(blob(n) for n in range(3))
    a, b, c = blobs
    root = tmp_path / "cache"
    reading = BlobCache(root, 1_000)  # another attempt, still reading a
    path_a = reading.get(a, server(blobs, []))
    age(path_a, 600)
    with BlobCache(root, 1_000) as cache:
        cache.get(b, server(blobs, []))
        cache.get(c, server(blobs, []))  # b is pinned by this attempt itself: kept too
        assert path_a.is_file() and cache.path_for(b).is_file()
        assert cache.size() == 3_000  # over the bound while everything is pinned
    reading.close()
    with BlobCache(root, 1_000) as cache:
        cache.evict()  # nothing pinned now: down to the most recently used one
        assert [e.path.name for e in cache.entries()] == [c]


def test_two_fetchers_of_one_digest_download_it_once(tmp_path):
    sha, data = blob(7, size=50_000)
    calls: list[str] = []
    started = threading.Event()

    def slow(sha256: str, sink: Sink) -> None:
        calls.append(sha256)
        started.set()
        time.sleep(0.3)  # the second fetcher arrives while this one downloads
        sink(data)

    barrier = threading.Barrier(2)
    results: list[bytes] = []
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            with BlobCache(tmp_path / "cache", 10**6) as cache:  # one per slot/process
                barrier.wait()
                results.append(cache.get(sha, slow).read_bytes())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors, errors
    assert calls == [sha]
    assert results == [data, data]
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
