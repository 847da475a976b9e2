"""DELETE /v1/artifacts/{id}: the row and (when no one else shares it) the blob go; another
project's id is a 404; a queued job's artifact is a 409 naming the job — also when the job is
submitted concurrently (row locks on real PostgreSQL, two connections)."""

from __future__ import annotations

import hashlib
import threading
import uuid
from typing import Any

import numpy as np
from safetensors.numpy import save as st_save
from sqlalchemy import text
from storage_helpers import assert_problem, checkpoint_bytes, upload, wait_until_blocked

SPEC = {
    "d_model": 4,
    "n_heads": 2,
    "d_ff": 8,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 8, "seq_len": 6},
}
TARGETS = {"tolerances": [0.05], "radius": 0.05, "orderings": 8, "bootstrap": 20}


def dataset_bytes() -> bytes:
    rng = np.random.default_rng(1)
    return st_save(
        {
            "inputs": rng.integers(0, 8, size=(5, 6)).astype(np.int64),
            "targets": rng.integers(0, 8, size=(5, 6)).astype(np.int64),
        }
    )


def analyze_body(checkpoint: str, dataset: str) -> dict[str, Any]:
    return {
        "kind": "analyze",
        "model": SPEC,
        "checkpoint": checkpoint,
        "dataset": dataset,
        "targets": TARGETS,
    }


def test_delete_removes_the_row_and_the_blob_and_other_projects_get_404(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], store: Any
) -> None:
    data = checkpoint_bytes(0)
    sha = hashlib.sha256(data).hexdigest()
    artifact = upload(client, auth_headers, data).json()
    assert store.exists(sha)

    assert_problem(
        client.delete(f"/v1/artifacts/{artifact['id']}", headers=other_auth_headers), 404
    )
    assert client.get(f"/v1/artifacts/{artifact['id']}", headers=auth_headers).status_code == 200
    assert store.exists(sha)

    assert client.delete(f"/v1/artifacts/{artifact['id']}", headers=auth_headers).status_code == 204
    assert_problem(client.get(f"/v1/artifacts/{artifact['id']}", headers=auth_headers), 404)
    assert not store.exists(sha)
    assert_problem(client.delete(f"/v1/artifacts/{artifact['id']}", headers=auth_headers), 404)
    assert_problem(client.delete(f"/v1/artifacts/{uuid.uuid4()}", headers=auth_headers), 404)


def test_shared_content_stays_until_its_last_row_goes(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], store: Any
) -> None:
    data = checkpoint_bytes(1)
    sha = hashlib.sha256(data).hexdigest()
    mine = upload(client, auth_headers, data).json()
    theirs = upload(client, other_auth_headers, data).json()
    assert client.delete(f"/v1/artifacts/{mine['id']}", headers=auth_headers).status_code == 204
    assert store.exists(sha)
    content = client.get(f"/v1/artifacts/{theirs['id']}/content", headers=other_auth_headers)
    assert content.status_code == 200 and content.content == data
    deleted = client.delete(f"/v1/artifacts/{theirs['id']}", headers=other_auth_headers)
    assert deleted.status_code == 204
    assert not store.exists(sha)


def test_an_artifact_of_a_queued_job_is_refused_until_the_job_ends(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    checkpoint = upload(client, auth_headers, checkpoint_bytes(2)).json()["id"]
    dataset = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    job = client.post("/v1/jobs", headers=auth_headers, json=analyze_body(checkpoint, dataset))
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]

    for artifact_id in (checkpoint, dataset):
        problem = assert_problem(
            client.delete(f"/v1/artifacts/{artifact_id}", headers=auth_headers), 409
        )
        assert problem["jobs"] == [{"id": job_id, "status": "queued"}]
    db_session.execute(text("UPDATE job SET status = 'running' WHERE id = :id"), {"id": job_id})
    problem = assert_problem(client.delete(f"/v1/artifacts/{dataset}", headers=auth_headers), 409)
    assert problem["jobs"] == [{"id": job_id, "status": "running"}]
    db_session.execute(
        text("UPDATE job SET status = 'failed', finished_at = now() WHERE id = :id"),
        {"id": job_id},
    )
    for artifact_id in (checkpoint, dataset):
        deleted = client.delete(f"/v1/artifacts/{artifact_id}", headers=auth_headers)
        assert deleted.status_code == 204


def test_job_outputs_are_not_deleted_one_by_one(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    upload_id = upload(client, auth_headers, checkpoint_bytes(4)).json()["id"]
    job_id = db_session.execute(
        text(
            "INSERT INTO job (id, project_id, kind, queue, status, request, finished_at) "
            "SELECT :id, project_id, 'plan', 'cpu', 'succeeded', '{}'::jsonb, now() "
            "FROM artifact WHERE id = :upload RETURNING id"
        ),
        {"id": uuid.uuid4(), "upload": upload_id},
    ).scalar_one()
    output = db_session.execute(
        text(
            "INSERT INTO artifact (id, project_id, kind, name, storage, sha256, size_bytes, job_id)"
            " SELECT :id, project_id, 'job-output', 'losses', 'blob', :sha, 1, id FROM job "
            "WHERE id = :job RETURNING id"
        ),
        {"id": uuid.uuid4(), "sha": "0" * 64, "job": job_id},
    ).scalar_one()
    problem = assert_problem(client.delete(f"/v1/artifacts/{output}", headers=auth_headers), 409)
    assert problem["artifact_kind"] == "job-output"


def test_delete_racing_a_job_submission_waits_for_it_and_refuses(
    live_client: Any, live_headers: dict[str, str], engine: Any
) -> None:
    """A submission holds the artifact rows it checked (FOR KEY SHARE) until it commits; the
    delete waits for it, then sees the queued job and answers 409 — never a queued job whose
    artifact is gone."""
    from curvplan.types.jobs import CLIENT_JOB_CREATE_ADAPTER, artifact_references
    from curvplan_core.db import make_sessionmaker
    from curvplan_server.artifacts.service import check_references
    from curvplan_server.jobs.service import create_job

    checkpoint = upload(live_client, live_headers, checkpoint_bytes(3)).json()
    dataset = upload(live_client, live_headers, dataset_bytes(), kind="dataset").json()
    with engine.connect() as conn:
        project_id = conn.execute(
            text("SELECT project_id FROM artifact WHERE id = :id"), {"id": checkpoint["id"]}
        ).scalar_one()
    body = CLIENT_JOB_CREATE_ADAPTER.validate_python(analyze_body(checkpoint["id"], dataset["id"]))

    with make_sessionmaker(engine)() as submit:
        check_references(submit, project_id, artifact_references("analyze", body))  # 1st step
        answer: dict[str, Any] = {}
        deleter = threading.Thread(
            target=lambda: answer.update(
                r=live_client.delete(f"/v1/artifacts/{checkpoint['id']}", headers=live_headers)
            )
        )
        deleter.start()
        wait_until_blocked(engine, deleter, submit)
        job = create_job(submit, project_id, body, default_max_attempts=1).job
        submit.commit()
    deleter.join(10)
    problem = assert_problem(answer["r"], 409)
    assert problem["jobs"] == [{"id": str(job.id), "status": "queued"}]
    assert live_client.get(f"/v1/artifacts/{checkpoint['id']}", headers=live_headers).is_success
