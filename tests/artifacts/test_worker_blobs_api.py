"""``/v1/worker/blobs/{sha256}``: what a worker on another host reads and writes, and who may.

A worker credential (scope ``worker``, created by the worker through the database) reaches
only these routes; project keys and operator keys without the scope do not, and a worker
key reaches neither project nor operator routes.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save as st_save
from sqlalchemy import text


def output_bytes(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return st_save({"per_sample.losses": rng.standard_normal(16)})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


UPLOAD_LIMIT = 8192


@pytest.fixture
def settings(settings: Any) -> Any:
    """The artifact tests' settings with a small worker upload limit."""
    return settings.model_copy(update={"worker_upload_max_bytes": UPLOAD_LIMIT})


@pytest.fixture
def worker_id(db_session: Any) -> str:
    wid = f"host-b-{uuid.uuid4().hex[:8]}"
    db_session.execute(
        text(
            "INSERT INTO worker (id, hostname, pid, queues, status) "
            "VALUES (:id, 'host-b', 1, ARRAY['gpu'], 'running')"
        ),
        {"id": wid},
    )
    db_session.commit()
    return wid


@pytest.fixture
def worker_key(db_session: Any, worker_id: str) -> str:
    from curvplan_core.credentials.service_keys import create_worker_key

    key = create_worker_key(db_session.connection(), worker_id)
    db_session.commit()
    return key


@pytest.fixture
def worker_headers(worker_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {worker_key}"}


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()


def put(client: Any, headers: dict[str, str], digest: str, data: bytes) -> Any:
    return client.put(
        f"/v1/worker/blobs/{digest}",
        content=data,
        headers={**headers, "Content-Type": "application/octet-stream"},
    )


def test_upload_then_download_round_trips_the_verified_bytes(
    client: Any, worker_headers: dict[str, str], store: Any
) -> None:
    data = output_bytes()
    digest = sha(data)
    response = put(client, worker_headers, digest, data)
    assert response.status_code == 201, response.text
    assert response.json() == {"sha256": digest, "size_bytes": len(data), "created": True}
    assert sha(store.path_for(digest).read_bytes()) == digest  # placed at its address
    again = put(client, worker_headers, digest, data)
    assert (again.status_code, again.json()["created"]) == (200, False)
    got = client.get(f"/v1/worker/blobs/{digest}", headers=worker_headers)
    assert got.status_code == 200
    assert got.headers["etag"] == f'"{digest}"'
    assert sha(got.content) == digest and got.content == data
    assert store.temp_files() == []


def test_a_body_that_does_not_hash_to_the_path_is_refused_and_nothing_is_kept(
    client: Any, worker_headers: dict[str, str], store: Any
) -> None:
    data, other = output_bytes(1), output_bytes(2)
    body = assert_problem(put(client, worker_headers, sha(other), data), 422)
    assert body["errors"][0]["field"] == "body"
    assert sha(data) in body["errors"][0]["message"]
    assert store.blobs() == [] and store.temp_files() == []


def test_a_body_that_is_not_safetensors_is_refused_and_nothing_is_kept(
    client: Any, worker_headers: dict[str, str], store: Any
) -> None:
    junk = b"\xff" * 64
    body = assert_problem(put(client, worker_headers, sha(junk), junk), 422)
    assert body["errors"][0]["field"] == "body"
    assert store.blobs() == [] and store.temp_files() == []


def test_a_header_integer_of_over_4300_digits_is_a_422_not_a_500(
    client: Any, worker_headers: dict[str, str], store: Any
) -> None:
    header = b'{"w": {"dtype": "F32", "shape": [' + b"1" * 5000 + b'], "data_offsets": [0, 4]}}'
    data = struct.pack("<Q", len(header)) + header + b"\x00" * 4
    body = assert_problem(put(client, worker_headers, sha(data), data), 422)
    assert body["errors"][0]["field"] == "body" and "4300" in body["errors"][0]["message"]
    assert store.temp_files() == [] and store.blobs() == []


@pytest.mark.parametrize("digest", ["abc", "G" * 64, "A" * 64, "0" * 65])
def test_a_malformed_digest_is_a_422_naming_it(
    client: Any, worker_headers: dict[str, str], store: Any, digest: str
) -> None:
    for response in (
        client.get(f"/v1/worker/blobs/{digest}", headers=worker_headers),
        put(client, worker_headers, digest, output_bytes()),
    ):
        body = assert_problem(response, 422)
        assert body["errors"][0]["field"] == "path.sha256"
    assert store.blobs() == [] and store.temp_files() == []


def test_an_absent_blob_is_a_404_problem(client: Any, worker_headers: dict[str, str]) -> None:
    assert_problem(client.get(f"/v1/worker/blobs/{'0' * 64}", headers=worker_headers), 404)


def test_only_a_worker_credential_reaches_the_worker_routes(
    client: Any, auth_headers: dict[str, str], operator_headers: dict[str, str], store: Any
) -> None:
    data = output_bytes()
    digest = sha(data)
    path = f"/v1/worker/blobs/{digest}"
    assert_problem(client.get(path), 401)
    for headers, status in ((auth_headers, 403), (operator_headers, 403)):
        assert_problem(client.get(path, headers=headers), status)
        assert_problem(put(client, headers, digest, data), status)
    assert store.blobs() == []


def test_a_worker_credential_reaches_no_project_or_operator_route(
    client: Any, worker_headers: dict[str, str]
) -> None:
    for route in ("/v1/jobs", "/v1/artifacts", "/v1/storage"):
        assert_problem(client.get(route, headers=worker_headers), 401)  # not a project key
    assert_problem(client.get("/v1/workers", headers=worker_headers), 403)
    assert_problem(client.get("/metrics", headers=worker_headers), 403)


def test_a_stopped_or_stale_workers_key_is_revoked(
    client: Any, db_session: Any, worker_id: str, worker_headers: dict[str, str]
) -> None:
    from curvplan_core.credentials.service_keys import create_worker_key, worker_key_valid
    from curvplan_core.jobs import store as worker_store

    path = f"/v1/worker/blobs/{'0' * 64}"
    assert client.get(path, headers=worker_headers).status_code == 404  # accepted
    conn = db_session.connection()
    # A stale worker (no heartbeat for longer than the limit) loses its key with its row.
    conn.execute(
        text("UPDATE worker SET last_heartbeat_at = now() - interval '1 hour' WHERE id = :id"),
        {"id": worker_id},
    )
    live_id = f"host-c-{uuid.uuid4().hex[:8]}"
    conn.execute(
        text(
            "INSERT INTO worker (id, hostname, pid, queues, status) "
            "VALUES (:id, 'host-c', 2, ARRAY['gpu'], 'running')"
        ),
        {"id": live_id},
    )
    live_key = create_worker_key(conn, live_id)
    assert worker_id in worker_store.mark_stale_workers(conn, 60)
    db_session.commit()
    assert_problem(client.get(path, headers=worker_headers), 401)
    assert worker_key_valid(db_session.connection(), live_key)  # a live worker keeps its own
    worker_store.stop_worker(db_session.connection(), live_id)  # and loses it at stop
    db_session.commit()
    assert not worker_key_valid(db_session.connection(), live_key)
    assert_problem(client.get(path, headers={"Authorization": f"Bearer {live_key}"}), 401)


def test_an_upload_past_the_limit_is_413_and_nothing_is_kept(
    client: Any, worker_headers: dict[str, str], store: Any
) -> None:
    big = st_save({"x": np.zeros(UPLOAD_LIMIT, dtype=np.float32)})
    body = assert_problem(put(client, worker_headers, sha(big), big), 413)
    assert body["max_body_bytes"] == UPLOAD_LIMIT
    assert store.blobs() == [] and store.temp_files() == []


def test_remote_access_caches_verified_blobs_and_retries_a_corrupt_one(
    client: Any,
    worker_key: str,
    worker_headers: dict[str, str],
    store: Any,
    engine: Any,
    tmp_path: Any,
) -> None:
    """The worker's side against the real routes: a fetched blob lands in the cache with its
    digest; a blob whose stored bytes no longer match (disk corruption on the API's host)
    fails the attempt as a transient error and leaves nothing; an absent one is a JobError."""
    from curvplan_core.artifacts.blobstore import BlobStore
    from curvplan_worker.analyze.artifacts import ArtifactAccess
    from curvplan_worker.blobs.cache import BlobCache
    from curvplan_worker.blobs.client import BlobApi, BlobTransferError
    from curvplan_worker.errors import JobError, RetryableError

    good, bad = output_bytes(3), output_bytes(4)
    for data in (good, bad):
        assert put(client, worker_headers, sha(data), data).status_code == 201
    store.path_for(sha(bad)).write_bytes(good)  # corrupted at rest
    worker_store = BlobStore(tmp_path / "worker" / "blobs")  # the worker's own: empty
    cache = BlobCache(tmp_path / "worker" / "cache", 10**6)
    api = BlobApi("http://testserver", worker_key, 10, client=client)
    with ArtifactAccess(engine, worker_store, api=api, cache=cache) as access:
        path = access.blob_path(sha(good), "test blob")
        assert path == cache.path_for(sha(good)) and sha(path.read_bytes()) == sha(good)
        with pytest.raises(BlobTransferError, match=sha(bad)) as caught:
            access.blob_path(sha(bad), "test blob")
        assert isinstance(caught.value, RetryableError)
        assert not cache.path_for(sha(bad)).exists() and list(cache.tmp_dir.iterdir()) == []
        with pytest.raises(JobError) as missing:
            access.blob_path("0" * 64, "test blob")
        assert missing.value.type == "artifact-missing"
        assert "API's store" in missing.value.detail


def test_head_says_whether_the_store_holds_a_blob(
    client: Any, worker_headers: dict[str, str], auth_headers: dict[str, str]
) -> None:
    data = output_bytes(5)
    assert put(client, worker_headers, sha(data), data).status_code == 201
    found = client.head(f"/v1/worker/blobs/{sha(data)}", headers=worker_headers)
    assert (found.status_code, found.headers["content-length"]) == (200, str(len(data)))
    assert client.head(f"/v1/worker/blobs/{'0' * 64}", headers=worker_headers).status_code == 404
    assert client.head(f"/v1/worker/blobs/{sha(data)}", headers=auth_headers).status_code == 403


def test_a_remote_output_deleted_before_its_row_is_uploaded_again(
    client: Any, worker_key: str, store: Any, engine: Any, tmp_path: Any
) -> None:
    """Between the upload and the row's transaction a deleter may remove the (unreferenced)
    blob; the worker checks under the blob's lock and uploads again, so the committed row
    never points at nothing."""
    from curvplan_core.artifacts.blobstore import BlobStore
    from curvplan_worker.analyze.artifacts import ArtifactAccess
    from curvplan_worker.blobs.cache import BlobCache
    from curvplan_worker.blobs.client import BlobApi

    class DeletedOnce(BlobApi):
        uploads = 0

        def upload(self, path: Any, sha256: str) -> None:
            super().upload(path, sha256)
            self.uploads += 1
            if self.uploads == 1:
                store.delete(sha256)  # a collector's or an artifact deletion's work

    project, job = uuid.uuid4(), uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO project (id, name) VALUES (:id, :name)"),
            {"id": project, "name": f"remote-out-{project.hex[:8]}"},
        )
        conn.execute(
            text(
                "INSERT INTO job (id, project_id, kind, queue, name, tags, status, attempt,"
                " request, started_at) VALUES (:id, :p, 'analyze', 'gpu', 'o', '{}'::jsonb,"
                " 'running', 1, '{}'::jsonb, now())"
            ),
            {"id": job, "p": project},
        )
    api = DeletedOnce("http://testserver", worker_key, 10, client=client)
    cache = BlobCache(tmp_path / "worker" / "cache", 10**6)
    try:
        with ArtifactAccess(
            engine, BlobStore(tmp_path / "worker" / "blobs"), api=api, cache=cache
        ) as access:
            losses = np.arange(5.0)
            artifact_id = access.store_output(
                job_id=str(job), attempt=1, name="per_sample_losses", tensors={"losses": losses}
            )
        assert api.uploads == 2
        with engine.connect() as conn:
            digest = conn.execute(
                text("SELECT sha256 FROM artifact WHERE id = :id"), {"id": artifact_id}
            ).scalar_one()
        assert sha(store.path_for(digest).read_bytes()) == digest
        assert list((tmp_path / "worker" / "blobs" / "tmp").iterdir()) == []
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM project WHERE id = :id"), {"id": project})
