"""One client implementation: sync.py is generated from aio.py, and the async client keeps
the event loop free while it hashes a file."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr


def test_both_clients_offer_the_same_methods() -> None:
    from curvplan.client import AsyncClient, Client

    def public(cls: type) -> set[str]:
        return {n for n in vars(cls) if not n.startswith("_")}

    assert public(AsyncClient) - {"aclose"} == public(Client) - {"close"}


def test_async_upload_hashes_off_the_event_loop(tmp_path: Path) -> None:
    """While the file is hashed, the event loop keeps running (a ticker's longest stall is
    far below the time the hash takes); on the loop the stall would be the whole hash."""
    from curvplan.client import AsyncClient, ConnectionFailedError, RetryPolicy

    path = tmp_path / "big.safetensors"
    with path.open("wb") as fh:  # sparse: instant to create, real bytes to hash
        fh.truncate(128 * 1024 * 1024)
    started = time.perf_counter()
    from curvplan.client._common import sha256_file

    sha256_file(path)
    hash_seconds = time.perf_counter() - started
    if hash_seconds < 0.1:
        pytest.skip(f"hashing took {hash_seconds:.3f} s here: too fast to observe a stall")

    async def scenario() -> float:
        stalls: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                stalls.append(now - last)
                last = now

        # A closed port: the call fails right after the hash, without sending anything.
        client = AsyncClient("http://127.0.0.1:9", retry=RetryPolicy(max_retries=0))
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        try:
            with pytest.raises(ConnectionFailedError):
                await client.upload_artifact(path, "checkpoint")
        finally:
            done.set()
            await task
            await client.aclose()
        return max(stalls)

    longest_stall = asyncio.run(scenario())
    assert longest_stall < hash_seconds / 2, (longest_stall, hash_seconds)
