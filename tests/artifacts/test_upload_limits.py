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
    from curvplan_core.config import Settings

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


def test_reads_return_a_bounded_summary_and_the_tensors_page_through_all(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str]
) -> None:
    count = 250
    created = upload(client, auth_headers, many_tensors(count))
    assert created.status_code == 201, created.text
    names = [f"t{i:06d}" for i in range(count)]  # the oracle: byte order of the names
    for body in (
        created.json(),
        client.get(created.headers["location"], headers=auth_headers).json(),
        client.get("/v1/artifacts", headers=auth_headers).json()["items"][0],
    ):
        assert body["tensor_count"] == count and body["tensors_truncated"] is True
        assert sorted(body["tensors"]) == names[:PREVIEW]
        assert body["tensors"][names[0]] == {"dtype": "F32", "shape": [1]}
        assert body["size"] == 8 + struct.unpack("<Q", many_tensors(count)[:8])[0] + 4 * count
    link = created.json()["links"]["tensors"]
    seen: list[str] = []
    token = None
    while True:
        params: dict[str, Any] = {"page_size": 64}
        if token:
            params["page_token"] = token
        page = client.get(link, headers=auth_headers, params=params)
        assert page.status_code == 200, page.text
        seen += [t["name"] for t in page.json()["items"]]
        assert all(t["dtype"] == "F32" and t["shape"] == [1] for t in page.json()["items"])
        token = page.json()["next_page_token"]
        if token is None:
            break
    assert seen == names
    assert client.get(link, headers=other_auth_headers).status_code == 404  # not theirs


def test_a_small_file_is_listed_whole(client: Any, auth_headers: dict[str, str]) -> None:
    body = upload(client, auth_headers, many_tensors(3)).json()
    assert body["tensor_count"] == 3 and body["tensors_truncated"] is False
    assert sorted(body["tensors"]) == ["t000000", "t000001", "t000002"]
