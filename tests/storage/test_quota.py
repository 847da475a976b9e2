"""Per-project storage quotas: over the count is a 409, over the bytes a 413, both carrying the
current usage; nothing is stored by a refused upload; concurrent uploads cannot both squeeze
under the limit; deleting frees room."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import assert_problem, checkpoint_bytes, upload

MAX_ARTIFACTS = 2
MAX_BYTES = 4096


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    from curvplan_core.config import Settings

    (tmp_path / "files").mkdir()
    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        max_artifact_bytes=64 * 1024,
        artifact_uri_roots=[tmp_path / "files"],
        project_max_artifacts=MAX_ARTIFACTS,
        project_max_storage_bytes=MAX_BYTES,
    )


def test_count_quota_is_a_409_with_the_usage_and_deleting_frees_room(
    client: Any, auth_headers: dict[str, str], store: Any, tmp_path: Path
) -> None:
    first, second, third = (checkpoint_bytes(seed) for seed in (10, 11, 12))
    a = upload(client, auth_headers, first)
    b = upload(client, auth_headers, second)
    assert (a.status_code, b.status_code) == (201, 201)
    used = len(first) + len(second)
    assert upload(client, auth_headers, first).status_code == 200  # same content: no charge

    problem = assert_problem(upload(client, auth_headers, third), 409)
    assert problem["usage"] == {"bytes": used, "artifacts": 2}
    assert problem["quota"] == {"bytes": MAX_BYTES, "artifacts": MAX_ARTIFACTS}
    assert store.temp_files() == [] and len(store.blobs()) == 2
    uri = {"kind": "checkpoint", "uri": f"file://{tmp_path / 'files' / 'm.safetensors'}"}
    assert_problem(client.post("/v1/artifacts", headers=auth_headers, json=uri), 409)

    usage = client.get("/v1/storage", headers=auth_headers).json()
    assert usage == {
        "usage": {"bytes": used, "artifacts": 2},
        "quota": {"bytes": MAX_BYTES, "artifacts": MAX_ARTIFACTS},
    }
    assert client.delete(f"/v1/artifacts/{a.json()['id']}", headers=auth_headers).status_code == 204
    assert upload(client, auth_headers, third).status_code == 201


def test_byte_quota_is_a_413_with_the_usage_and_stores_nothing(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], store: Any
) -> None:
    small = checkpoint_bytes(20)
    big = checkpoint_bytes(21, rows=MAX_BYTES // 16)  # more than MAX_BYTES - len(small)
    assert len(small) < MAX_BYTES < len(small) + len(big) < 64 * 1024
    assert upload(client, auth_headers, small).status_code == 201
    problem = assert_problem(upload(client, auth_headers, big), 413)
    assert problem["usage"] == {"bytes": len(small), "artifacts": 1}
    assert problem["quota"]["bytes"] == MAX_BYTES
    assert store.temp_files() == [] and len(store.blobs()) == 1
    # A declared size that cannot fit is refused before the body is read: junk that would
    # otherwise be a 422 (invalid safetensors) is a 413 too, and nothing reaches tmp/.
    junk = upload(client, auth_headers, b"\x00" * (MAX_BYTES + 20 * 1024))
    assert assert_problem(junk, 413)["usage"] == {"bytes": len(small), "artifacts": 1}
    assert store.temp_files() == [] and len(store.blobs()) == 1
    # Another project's usage is its own.
    usage = client.get("/v1/storage", headers=other_auth_headers).json()["usage"]
    assert usage == {"bytes": 0, "artifacts": 0}


def test_concurrent_uploads_cannot_both_take_the_last_slot(
    live_client: Any, live_headers: dict[str, str], store: Any
) -> None:
    assert upload(live_client, live_headers, checkpoint_bytes(30)).status_code == 201
    answers: list[int] = []
    lock = threading.Lock()

    def one(seed: int) -> None:
        status = upload(live_client, live_headers, checkpoint_bytes(seed)).status_code
        with lock:
            answers.append(status)

    threads = [threading.Thread(target=one, args=(31 + i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(answers) == [201, 409, 409, 409], answers
    usage = live_client.get("/v1/storage", headers=live_headers).json()["usage"]
    assert usage["artifacts"] == MAX_ARTIFACTS
    assert store.temp_files() == []
