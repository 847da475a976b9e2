"""Every kind's artifact fields are checked at submission and locked while the job is live.

The kinds declare their artifact fields once (``curvplan.types.jobs``): a ``sweep``'s
artifacts get the same 422s (naming the field) and the same 409 on deletion as an
``analyze``'s; the internal kinds are refused from clients; the ``job_artifact`` table holds
exactly the ids each body names, at their dotted paths.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save as st_save
from sqlalchemy import text
from storage_helpers import assert_problem, checkpoint_bytes, upload
from test_delete_artifact import SPEC, analyze_body, dataset_bytes


def other_dataset_bytes() -> bytes:
    """A dataset with other content than :func:`dataset_bytes` (so another artifact)."""
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 8, size=(4, 6)).astype(np.int64)
    return st_save({"inputs": tokens, "targets": tokens})


def sweep_body(checkpoint: str | None, train: str, evaluation: str) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "model": SPEC,
        "checkpoint": checkpoint,
        "train_data": train,
        "eval_data": evaluation,
        "sweep": {"type": "batch", "target_loss": 1.5, "batch_sizes": [2, 4, 8], "max_steps": 5},
    }


def branch_body(checkpoints: list[str], data: str) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "model": SPEC,
        "checkpoints": checkpoints,
        "train_data": data,
        "eval_data": data,
        "sweep": {"type": "branch", "batch_sizes": [2, 4], "window_tokens": 48},
    }


def _links(db_session: Any, job_id: str) -> set[tuple[str, str]]:
    rows = db_session.execute(
        text("SELECT field, artifact_id FROM job_artifact WHERE job_id = :j"), {"j": job_id}
    )
    return {(row.field, str(row.artifact_id)) for row in rows}


def _job_count(db_session: Any) -> int:
    return db_session.execute(text("SELECT count(*) FROM job")).scalar_one()


def _errors(problem: dict[str, Any]) -> dict[str, str]:
    return {e["field"]: e["type"] for e in problem["errors"]}


def test_a_sweep_naming_another_projects_missing_or_wrong_kind_artifacts_is_refused(
    client: Any,
    auth_headers: dict[str, str],
    other_auth_headers: dict[str, str],
    db_session: Any,
) -> None:
    mine = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    my_checkpoint = upload(client, auth_headers, checkpoint_bytes(10)).json()["id"]
    theirs = upload(client, other_auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    before = _job_count(db_session)

    problem = assert_problem(
        client.post("/v1/jobs", headers=auth_headers, json=sweep_body(None, theirs, mine)), 422
    )
    assert _errors(problem) == {"body.train_data": "artifact_not_found"}
    assert "not found in this project" in problem["errors"][0]["message"]

    problem = assert_problem(
        client.post(
            "/v1/jobs",
            headers=auth_headers,
            json=sweep_body(mine, my_checkpoint, str(uuid.uuid4())),
        ),
        422,
    )
    assert _errors(problem) == {
        "body.checkpoint": "artifact_kind",  # a dataset where a checkpoint belongs
        "body.train_data": "artifact_kind",
        "body.eval_data": "artifact_not_found",
    }
    assert _job_count(db_session) == before  # nothing was queued

    accepted = client.post(
        "/v1/jobs", headers=auth_headers, json=sweep_body(my_checkpoint, mine, mine)
    )
    assert accepted.status_code == 202, accepted.text


def test_an_artifact_of_a_queued_sweep_cannot_be_deleted_until_the_sweep_ends(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    checkpoint = upload(client, auth_headers, checkpoint_bytes(11)).json()["id"]
    train = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    evaluation_id = upload(client, auth_headers, other_dataset_bytes(), kind="dataset").json()["id"]
    job = client.post(
        "/v1/jobs", headers=auth_headers, json=sweep_body(checkpoint, train, evaluation_id)
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]

    for artifact_id in (checkpoint, train, evaluation_id):
        problem = assert_problem(
            client.delete(f"/v1/artifacts/{artifact_id}", headers=auth_headers), 409
        )
        assert problem["jobs"] == [{"id": job_id, "status": "queued"}]
    db_session.execute(
        text("UPDATE job SET status = 'cancelled', finished_at = now() WHERE id = :id"),
        {"id": job_id},
    )
    for artifact_id in (checkpoint, train, evaluation_id):
        deleted = client.delete(f"/v1/artifacts/{artifact_id}", headers=auth_headers)
        assert deleted.status_code == 204, deleted.text
    assert _links(db_session, job_id) == set()  # the rows went with their artifacts


def test_a_branch_sweeps_checkpoints_are_checked_one_by_one_and_locked_while_it_is_live(
    client: Any,
    auth_headers: dict[str, str],
    other_auth_headers: dict[str, str],
    db_session: Any,
) -> None:
    data = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    early, late = (upload(client, auth_headers, checkpoint_bytes(s)).json()["id"] for s in (20, 21))
    other_model = upload(client, auth_headers, checkpoint_bytes(22, rows=9)).json()["id"]
    theirs = upload(client, other_auth_headers, checkpoint_bytes(23)).json()["id"]
    before = _job_count(db_session)

    cases = [
        ([early, theirs], {"body.checkpoints.1": "artifact_not_found"}),
        ([early, str(uuid.uuid4()), data], {
            "body.checkpoints.1": "artifact_not_found",
            "body.checkpoints.2": "artifact_kind",  # a dataset where a checkpoint belongs
        }),
        ([early, late, early], {"body.checkpoints.2": "duplicate_checkpoint"}),
        ([early, other_model], {"body.checkpoints.1": "checkpoint_mismatch"}),
        ([], {"body.checkpoints": "value_error"}),  # a branch sweep needs its checkpoints
    ]  # fmt: skip
    for checkpoints, expected in cases:
        response = client.post(
            "/v1/jobs", headers=auth_headers, json=branch_body(checkpoints, data)
        )
        problem = assert_problem(response, 422)
        assert _errors(problem) == expected, problem
    mismatch = assert_problem(
        client.post("/v1/jobs", headers=auth_headers, json=branch_body([early, other_model], data)),
        422,
    )
    assert "other shape embed.weight" in mismatch["errors"][0]["message"]
    assert _job_count(db_session) == before  # nothing was queued

    job = client.post("/v1/jobs", headers=auth_headers, json=branch_body([early, late], data))
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    assert _links(db_session, job_id) == {
        ("checkpoints.0", early),
        ("checkpoints.1", late),
        ("train_data", data),
        ("eval_data", data),
    }
    for artifact_id in (early, late):
        problem = assert_problem(
            client.delete(f"/v1/artifacts/{artifact_id}", headers=auth_headers), 409
        )
        assert problem["jobs"] == [{"id": job_id, "status": "queued"}]
    db_session.execute(
        text("UPDATE job SET status = 'cancelled', finished_at = now() WHERE id = :id"),
        {"id": job_id},
    )
    db_session.commit()
    for artifact_id in (early, late):
        deleted = client.delete(f"/v1/artifacts/{artifact_id}", headers=auth_headers)
        assert deleted.status_code == 204, deleted.text


def moments_bytes(rows: int = 8, *, drop: str | None = None) -> bytes:
    """An AdamW state for :func:`checkpoint_bytes`' tensors (safetensors, step metadata)."""
    shapes = {"embed.weight": (rows, 4), "head.weight": (3, 4)}
    tensors = {
        f"{kind}.{name}": np.full(shape, 0.1, dtype=np.float32)
        for name, shape in shapes.items()
        for kind in ("exp_avg", "exp_avg_sq")
    }
    tensors.pop(drop or "", None)
    return st_save(tensors, metadata={"step": "20"})


def test_a_branch_sweeps_optimizer_states_are_checked_against_its_checkpoints(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    data = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    early, late = (upload(client, auth_headers, checkpoint_bytes(s)).json()["id"] for s in (30, 31))
    state = upload(client, auth_headers, moments_bytes()).json()["id"]
    short = upload(client, auth_headers, moments_bytes(drop="exp_avg_sq.head.weight")).json()
    other = upload(client, auth_headers, moments_bytes(rows=9)).json()["id"]
    before = _job_count(db_session)
    cases = [
        ([state], {"body.optimizer_states": "value_error"}),  # one per checkpoint
        ([state, short["id"]], {"body.optimizer_states.1": "optimizer_state_mismatch"}),
        ([other, None], {"body.optimizer_states.0": "optimizer_state_mismatch"}),
        ([str(uuid.uuid4()), None], {"body.optimizer_states.0": "artifact_not_found"}),
        ([data, None], {"body.optimizer_states.0": "artifact_kind"}),
    ]
    for states, expected in cases:
        body = branch_body([early, late], data) | {"optimizer_states": states}
        problem = assert_problem(client.post("/v1/jobs", headers=auth_headers, json=body), 422)
        assert _errors(problem) == expected, problem
    body = branch_body([early, late], data) | {"optimizer_states": [short["id"], None]}
    problem = assert_problem(client.post("/v1/jobs", headers=auth_headers, json=body), 422)
    assert "missing exp_avg_sq.head.weight" in problem["errors"][0]["message"]
    assert _job_count(db_session) == before  # nothing was queued
    body = branch_body([early, late], data) | {"optimizer_states": [None, state]}
    job = client.post("/v1/jobs", headers=auth_headers, json=body)
    assert job.status_code == 202, job.text
    assert ("optimizer_states.1", state) in _links(db_session, job.json()["id"])


@pytest.mark.parametrize("kind", ["analyze_blocks", "sweep_point"])
def test_clients_cannot_submit_the_internal_kinds(
    client: Any, auth_headers: dict[str, str], db_session: Any, kind: str
) -> None:
    checkpoint = upload(client, auth_headers, checkpoint_bytes(12)).json()["id"]
    data = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    bodies = {  # otherwise valid bodies of the kind (the worker's contract accepts them)
        "analyze_blocks": {"model": SPEC, "checkpoint": checkpoint, "dataset": data},
        "sweep_point": {
            "model": SPEC,
            "train_data": data,
            "eval_data": data,
            "point": {
                "type": "batch",
                "batch_size": 4,
                "lr": 1e-3,
                "max_steps": 5,
                "eval_every": 1,
            },
        },
    }
    from curvplan.types.jobs import JOB_CREATE_ADAPTER

    JOB_CREATE_ADAPTER.validate_python({"kind": kind, **bodies[kind]})
    before = _job_count(db_session)
    problem = assert_problem(
        client.post("/v1/jobs", headers=auth_headers, json={"kind": kind, **bodies[kind]}), 422
    )
    assert _errors(problem) == {"body.kind": "internal_kind"}
    assert f"'{kind}'" in problem["errors"][0]["message"]
    assert "'sweep'" in problem["errors"][0]["message"]  # what to submit instead
    assert _job_count(db_session) == before


def test_the_link_table_holds_every_id_a_body_names_at_its_field(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    rng = np.random.default_rng(13)
    halves = [{name: rng.standard_normal((4, 4)).astype(np.float32)} for name in ("a", "b")]
    shards = [upload(client, auth_headers, st_save(half)).json()["id"] for half in halves]
    # Intermediates are earlier saves of the same tensors: one whole file, or shards.
    earlier = {name: rng.standard_normal((4, 4)).astype(np.float32) for name in ("a", "b")}
    early = upload(client, auth_headers, st_save(earlier)).json()["id"]
    early_a = upload(client, auth_headers, st_save({"a": earlier["a"]})).json()["id"]
    data = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]

    body = {
        **analyze_body(shards[0], data),
        "checkpoint": shards,
        "intermediate_checkpoints": [early, [early_a, shards[1]]],
    }
    analyze = client.post("/v1/jobs", headers=auth_headers, json=body)
    assert analyze.status_code == 202, analyze.text
    assert _links(db_session, analyze.json()["id"]) == {
        ("dataset", data),
        ("checkpoint.0", shards[0]),
        ("checkpoint.1", shards[1]),
        ("intermediate_checkpoints.0", early),
        ("intermediate_checkpoints.1.0", early_a),
        ("intermediate_checkpoints.1.1", shards[1]),
    }

    sweep = client.post("/v1/jobs", headers=auth_headers, json=sweep_body(None, data, data))
    assert sweep.status_code == 202, sweep.text
    assert _links(db_session, sweep.json()["id"]) == {("train_data", data), ("eval_data", data)}

    plan = {"kind": "plan", "measurements": {"per_sample_losses": [0.5, 0.7], "loss_bound": 1.0}}
    planned = client.post("/v1/jobs", headers=auth_headers, json=plan)
    assert planned.status_code == 202, planned.text
    assert _links(db_session, planned.json()["id"]) == set()

    # "in use" is answered by the links: the shard is used by the analysis only.
    problem = assert_problem(client.delete(f"/v1/artifacts/{shards[1]}", headers=auth_headers), 409)
    assert problem["jobs"] == [{"id": analyze.json()["id"], "status": "queued"}]
    problem = assert_problem(client.delete(f"/v1/artifacts/{data}", headers=auth_headers), 409)
    assert [j["id"] for j in problem["jobs"]] == [analyze.json()["id"], sweep.json()["id"]]


def test_every_id_field_of_every_kind_is_declared_an_artifact_field_or_a_job_reference() -> None:
    """The declaration cannot silently miss a field: every body field typed with UUIDs is
    either one of the kind's artifact fields or one of the known job references."""
    from curvplan.types.jobs import (
        CLIENT_JOB_KINDS,
        INTERNAL_JOB_KINDS,
        JOB_CREATE_TYPES,
        kind_name,
    )
    from curvplan_server.jobs.submission import KIND_SUBMISSIONS

    job_references = {("plan", "from_job"), ("analyze", "sweeps")}  # other jobs, not artifacts
    for create_type in JOB_CREATE_TYPES:
        kind = kind_name(create_type)
        declared = {f.name for f in create_type.artifact_fields}
        assert declared <= set(create_type.model_fields), kind
        typed_ids = {
            name
            for name, field in create_type.model_fields.items()
            if "UUID" in str(field.annotation)
        }
        assert typed_ids == declared | {n for k, n in job_references if k == kind}, kind
    assert set(INTERNAL_JOB_KINDS) == {"analyze_blocks", "sweep_point"}
    assert set(CLIENT_JOB_KINDS) == {"plan", "analyze", "sweep"}
    assert {kind_name(t) for t in KIND_SUBMISSIONS} <= set(CLIENT_JOB_KINDS)
