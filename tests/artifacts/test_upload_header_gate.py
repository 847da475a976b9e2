"""Concurrent upload headers are bounded by a memory budget: beyond it an upload is a 503 with
Retry-After before its header is read, and /healthz and /readyz stay responsive (a real
``curvplan serve``; twelve of the largest headers at once took 1.74 GB and stalled /healthz
for 8.8 s)."""

from __future__ import annotations

import json
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_plugin import ServerProcess, make_api_key, service_env

from curvplan_server.artifacts.header_gate import HEADER_MEMORY_FACTOR

pytestmark = pytest.mark.e2e

BOUNDARY = "gate-test-boundary"
TENSORS = 20_000


def _safetensors(seed: int) -> tuple[bytes, bytes]:
    """(the first 8 bytes and header, the data) of a file of TENSORS one-float tensors."""
    header = {f"t{i:05d}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
              for i in range(TENSORS)}  # fmt: skip
    header["__metadata__"] = {"seed": str(seed)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, struct.pack(f"<{TENSORS}f", *([seed] * TENSORS))


def _parts(seed: int) -> tuple[bytes, bytes, bytes]:
    head, data = _safetensors(seed)
    preamble = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="kind"\r\n\r\ncheckpoint\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="m.safetensors"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    return preamble + head, data, f"\r\n--{BOUNDARY}--\r\n".encode()


def _headers(key: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {key}",
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
    }


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    first, _ = _safetensors(0)
    budget = HEADER_MEMORY_FACTOR * len(first) * 3 // 2  # room for one such header, not two
    env = service_env(
        database_url, tmp_path / "data", CURVPLAN_UPLOAD_HEADER_MEMORY_BYTES=str(budget)
    )
    proc = ServerProcess(env, tmp_path / "server.log")
    proc.start()
    try:
        yield proc.url, make_api_key(database_url, f"gate-{uuid.uuid4().hex[:8]}")
    finally:
        proc.stop()


def test_uploads_beyond_the_header_budget_are_503_and_health_stays_quick(
    server: tuple[str, str],
) -> None:
    url, key = server
    release = threading.Event()
    header_sent = threading.Event()
    held: dict[str, Any] = {}

    def slow_body() -> Iterator[bytes]:
        head, data, tail = _parts(1)
        yield head
        yield data[:1024]
        header_sent.set()
        release.wait(60)  # the upload holds its header's share of the budget meanwhile
        yield data[1024:]
        yield tail

    def slow_upload() -> None:
        held["response"] = httpx.post(
            url + "/v1/artifacts", content=slow_body(), headers=_headers(key), timeout=120
        )

    thread = threading.Thread(target=slow_upload)
    thread.start()
    try:
        assert header_sent.wait(30)
        time.sleep(0.5)  # the server has read the first 8 bytes and taken the header's share
        busy = httpx.post(
            url + "/v1/artifacts", content=b"".join(_parts(2)), headers=_headers(key), timeout=60
        )
        assert busy.status_code == 503, busy.text
        assert int(busy.headers["Retry-After"]) >= 1
        assert busy.headers["content-type"].startswith("application/problem+json")
        for path in ("/healthz", "/readyz"):
            start = time.monotonic()
            assert httpx.get(url + path, timeout=10).status_code == 200
            assert time.monotonic() - start < 2.0, path  # generous on a loaded machine
    finally:
        release.set()
        thread.join(120)
    assert held["response"].status_code == 201, held["response"].text
    again = httpx.post(
        url + "/v1/artifacts", content=b"".join(_parts(2)), headers=_headers(key), timeout=60
    )
    assert again.status_code == 201, again.text  # the budget was given back
