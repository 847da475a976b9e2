"""An artifact's safetensors ``__metadata__``: bounded by a limit at upload, a bounded preview
in reads and lists, every entry in full from its own paged endpoint (a list of 40 artifacts
with 9.3 MB of metadata each was 374 MB and ran the API out of memory)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save as st_save

METADATA_LIMIT = 16 * 1024


@pytest.fixture
def settings(settings: Any) -> Any:
    return settings.model_copy(update={"max_safetensors_metadata_bytes": METADATA_LIMIT})


def _file(metadata: dict[str, str], seed: int) -> bytes:
    tensors = {"w": np.full((2, 2), seed, dtype=np.float32)}
    return st_save(tensors, metadata=metadata)


def _upload(client: Any, headers: dict[str, str], data: bytes) -> Any:
    return client.post(
        "/v1/artifacts",
        headers=headers,
        files={"file": ("m.safetensors", data, "application/octet-stream")},
        data={"kind": "checkpoint"},
    )


def _metadata(seed: int) -> dict[str, str]:
    """30 entries, one value long: ~14 KB, under the limit."""
    entries = {f"key{i:02d}": f"v{seed}-{i}" for i in range(30)}
    entries["key05"] = "x" * 12_000
    return entries


def test_lists_carry_a_bounded_preview_and_the_metadata_pages_in_full(
    client: Any, auth_headers: dict[str, str]
) -> None:
    uploaded = {}
    for seed in range(6):
        response = _upload(client, auth_headers, _file(_metadata(seed), seed))
        assert response.status_code == 201, response.text
        uploaded[response.json()["id"]] = _metadata(seed)

    page = client.get("/v1/artifacts", params={"page_size": 40}, headers=auth_headers)
    assert page.status_code == 200
    # 6 × 14 KB of metadata; the preview is 20 entries, values cut to 200 characters
    assert len(page.content) < 6 * 6_000, len(page.content)
    for item in page.json()["items"]:
        full = uploaded[item["id"]]
        assert item["metadata_count"] == 30 and item["metadata_truncated"] is True
        assert list(item["metadata"]) == sorted(full)[:20]
        assert item["metadata"]["key05"] == full["key05"][:200]
        assert item["metadata"]["key00"] == full["key00"]

    artifact_id, full = next(iter(uploaded.items()))
    one = client.get(f"/v1/artifacts/{artifact_id}", headers=auth_headers).json()
    assert one["metadata_count"] == 30 and len(one["metadata"]) == 20
    entries: dict[str, str] = {}
    url, params = one["links"]["metadata"], {"page_size": 7}
    while True:
        got = client.get(url, params=params, headers=auth_headers)
        assert got.status_code == 200, got.text
        body = got.json()
        assert len(body["items"]) <= 7
        entries.update({e["key"]: e["value"] for e in body["items"]})
        if body["next_page_token"] is None:
            break
        params = {"page_size": 7, "page_token": body["next_page_token"]}
    assert entries == full


def test_metadata_over_the_limit_is_a_413_and_nothing_is_stored(
    client: Any, auth_headers: dict[str, str]
) -> None:
    response = _upload(client, auth_headers, _file({"big": "y" * (METADATA_LIMIT + 1)}, 0))
    assert response.status_code == 413, response.text
    assert response.json()["max_metadata_bytes"] == METADATA_LIMIT
    listed = client.get("/v1/artifacts", headers=auth_headers).json()
    assert listed["items"] == []


def test_another_projects_metadata_is_not_found(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str]
) -> None:
    artifact = _upload(client, auth_headers, _file({"a": "b"}, 1)).json()
    other = client.get(artifact["links"]["metadata"], headers=other_auth_headers)
    assert other.status_code == 404
    mine = client.get(artifact["links"]["metadata"], headers=auth_headers).json()
    assert mine == {"items": [{"key": "a", "value": "b"}], "next_page_token": None}
    assert artifact["metadata"] == {"a": "b"} and artifact["metadata_truncated"] is False
