"""Limits on what one safetensors header may hold (tensor count, header bytes), and the
bounded metadata of an artifact with many tensors (a summary, the rest paged).

A header that listed a million tensors was accepted after two minutes, with the API process
at 1.66 GB, and every later read of the artifact returned tens of megabytes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from test_artifacts_api import assert_problem

MAX_TENSORS = 300
MAX_HEADER = 32 * 1024
PREVIEW = 7


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    from curvplan_server.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        max_artifact_bytes=1 << 20,
        max_safetensors_tensors=MAX_TENSORS,
        max_safetensors_header_bytes=MAX_HEADER,
        artifact_tensor_preview=PREVIEW,
    )


def many_tensors(count: int, pad: int = 0) -> bytes:
    """A valid safetensors file of ``count`` one-element F32 tensors (names padded by ``pad``)."""
    header = {
        f"t{i:06d}{'x' * pad}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        for i in range(count)
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\x00" * (4 * count)


def upload(client: Any, headers: dict[str, str], data: bytes) -> Any:
    return client.post(
        "/v1/artifacts",
        headers=headers,
        data={"kind": "checkpoint"},
        files={"file": ("m.safetensors", data, "application/octet-stream")},
    )


def test_a_header_listing_more_tensors_than_the_limit_is_a_422(
    client: Any, auth_headers: dict[str, str], store: Any
) -> None:
    problem = assert_problem(upload(client, auth_headers, many_tensors(MAX_TENSORS + 1)), 422)
    assert problem["errors"][0]["field"] == "body.file"
    assert f"at most {MAX_TENSORS}" in problem["detail"]
    assert store.temp_files() == [] and store.blobs() == []
    assert upload(client, auth_headers, many_tensors(MAX_TENSORS)).status_code == 201


def test_a_header_longer_than_the_limit_is_a_413(
    client: Any, auth_headers: dict[str, str], store: Any
) -> None:
    data = many_tensors(100, pad=400)  # ~45 kB of header, 100 tensors
    assert struct.unpack("<Q", data[:8])[0] > MAX_HEADER
    problem = assert_problem(upload(client, auth_headers, data), 413)
    assert problem["max_header_bytes"] == MAX_HEADER
    assert store.temp_files() == [] and store.blobs() == []
