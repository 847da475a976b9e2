"""Jobs API against real PostgreSQL: create, get, idempotency, list, cancel, recommendation."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from api_helpers import assert_problem, error_fields
from sqlalchemy import text, update
from test_typed_contract import without_removed_fields

from curvplan_core.jobs.models import Job

#: A real plan recommendation, as a worker stored it.
RECOMMENDATION = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "plan_result_v0.json").read_text()
)["recommendation"]


def _create(client: Any, headers: dict[str, str], body: dict[str, Any], **extra: str) -> Any:
    return client.post("/v1/jobs", json=body, headers={**headers, **extra})


def _set(db_session: Any, job_id: str, **values: Any) -> None:
    db_session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(**values))
    db_session.commit()


def test_create_returns_202_location_and_stores_the_validated_request(
    client, auth_headers, plan_body, db_session
) -> None:
    response = _create(client, auth_headers, plan_body)
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["kind"] == "plan" and job["queue"] == "cpu"
    assert job["name"] == "gpt-small-pilot" and job["tags"] == {"team": "nlp"}
    assert job["attempt"] == 0 and job["max_attempts"] == 3
    assert job["progress"] is None and job["result"] is None and job["error"] is None
    assert job["links"]["self"] == response.headers["location"]
    row = db_session.execute(
        text("SELECT status, queue, request, project_id FROM job WHERE id = :id"),
        {"id": job["id"]},
    ).one()
    assert row.status == "queued" and row.queue == "cpu"
    assert (
        row.request["measurements"]["per_sample_losses"]
        == plan_body["measurements"]["per_sample_losses"]
    )
    assert row.request["targets"]["tolerances"] == [0.01, 0.001]


def test_max_attempts_from_body(client, auth_headers, plan_body) -> None:
    plan_body["max_attempts"] = 5
    assert _create(client, auth_headers, plan_body).json()["max_attempts"] == 5
    plan_body["max_attempts"] = 0
    problem = assert_problem(_create(client, auth_headers, plan_body), 422)
    assert error_fields(problem) == {"body.max_attempts"}


def test_get_job_and_cross_project_is_404(
    client, auth_headers, other_auth_headers, plan_body
) -> None:
    job = _create(client, auth_headers, plan_body).json()
    got = client.get(f"/v1/jobs/{job['id']}", headers=auth_headers)
    assert got.status_code == 200
    assert got.json()["id"] == job["id"]
    assert got.json()["request"]["measurements"]["loss_bound"] == 5.0
    assert_problem(client.get(f"/v1/jobs/{job['id']}", headers=other_auth_headers), 404)
    assert_problem(client.get(f"/v1/jobs/{uuid.uuid4()}", headers=auth_headers), 404)
    problem = assert_problem(client.get("/v1/jobs/not-a-uuid", headers=auth_headers), 422)
    assert error_fields(problem) == {"path.job_id"}


# --------------------------------------------------------------------------- idempotency
def test_idempotency_same_key_same_body_replays(
    client, auth_headers, plan_body, db_session
) -> None:
    first = _create(client, auth_headers, plan_body, **{"Idempotency-Key": "k-1"})
    # Same JSON with other key order and whitespace: the same request.
    raw = json.dumps(dict(reversed(list(plan_body.items()))), indent=2)
    second = client.post(
        "/v1/jobs",
        content=raw,
        headers={**auth_headers, "Idempotency-Key": "k-1", "Content-Type": "application/json"},
    )
    assert first.status_code == second.status_code == 202
    assert second.json()["id"] == first.json()["id"]
    assert second.headers["location"] == first.headers["location"]
    assert second.headers.get("idempotent-replayed") == "true"
    assert "idempotent-replayed" not in first.headers
    assert second.json() == first.json()  # the original response, replayed
    count = db_session.execute(
        text("SELECT count(*) FROM job WHERE idempotency_key = 'k-1'")
    ).scalar_one()
    assert count == 1


def test_idempotent_replay_repeats_the_original_response_after_the_job_ran(
    client, auth_headers, plan_body, db_session
) -> None:
    first = _create(client, auth_headers, plan_body, **{"Idempotency-Key": "k-ran"})
    _set(
        db_session,
        first.json()["id"],
        status="succeeded",
        attempt=1,
        result={"recommendation": RECOMMENDATION},
        progress={"fraction": 1.0, "stage": "done", "message": "ok"},
    )
    replay = _create(client, auth_headers, plan_body, **{"Idempotency-Key": "k-ran"})
    assert replay.status_code == 202 and replay.json() == first.json()
    current = client.get(replay.headers["location"], headers=auth_headers).json()
    assert current["status"] == "succeeded" and current["attempt"] == 1


def test_idempotency_same_key_other_body_is_422(client, auth_headers, plan_body) -> None:
    first = _create(client, auth_headers, plan_body, **{"Idempotency-Key": "k-2"})
    plan_body["measurements"]["loss_bound"] = 6.0
    problem = assert_problem(
        _create(client, auth_headers, plan_body, **{"Idempotency-Key": "k-2"}), 422
    )
    assert error_fields(problem) == {"header.Idempotency-Key"}
    assert problem["job_id"] == first.json()["id"]


def test_idempotency_key_is_scoped_per_project(
    client, auth_headers, other_auth_headers, plan_body
) -> None:
    a = _create(client, auth_headers, plan_body, **{"Idempotency-Key": "shared"})
    b = _create(client, other_auth_headers, plan_body, **{"Idempotency-Key": "shared"})
    assert a.status_code == b.status_code == 202
    assert a.json()["id"] != b.json()["id"]
    assert "idempotent-replayed" not in b.headers


def test_idempotency_key_too_long_is_422(client, auth_headers, plan_body) -> None:
    problem = assert_problem(
        _create(client, auth_headers, plan_body, **{"Idempotency-Key": "x" * 300}), 422
    )
    assert error_fields(problem) == {"header.Idempotency-Key"}


# --------------------------------------------------------------------------- listing
def _ids(page: dict[str, Any]) -> list[str]:
    return [item["id"] for item in page["items"]]


def test_pagination_walks_every_job_once_newest_first(
    client, auth_headers, plan_body, db_session
) -> None:
    created = [_create(client, auth_headers, plan_body).json()["id"] for _ in range(7)]
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        params: dict[str, Any] = {"page_size": 3}
        if token:
            params["page_token"] = token
        page = client.get("/v1/jobs", params=params, headers=auth_headers).json()
        pages += 1
        seen += _ids(page)
        token = page["next_page_token"]
        if token is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(created) and len(seen) == len(set(seen))
    expected = [
        str(r.id)
        for r in db_session.execute(
            text(
                "SELECT id FROM job WHERE id = ANY(CAST(:ids AS uuid[])) "
                "ORDER BY created_at DESC, id DESC"
            ),
            {"ids": created},
        )
    ]
    assert seen == expected
    assert "request" not in client.get("/v1/jobs", headers=auth_headers).json()["items"][0]


def test_pagination_is_stable_when_jobs_arrive_between_pages(
    client, auth_headers, plan_body
) -> None:
    first_batch = [_create(client, auth_headers, plan_body).json()["id"] for _ in range(4)]
    page1 = client.get("/v1/jobs", params={"page_size": 2}, headers=auth_headers).json()
    newcomer = _create(client, auth_headers, plan_body).json()["id"]
    page2 = client.get(
        "/v1/jobs",
        params={"page_size": 2, "page_token": page1["next_page_token"]},
        headers=auth_headers,
    ).json()
    assert newcomer not in _ids(page1) + _ids(page2)
    assert sorted(_ids(page1) + _ids(page2)) == sorted(first_batch)


def test_list_filters(client, auth_headers, other_auth_headers, plan_body, db_session) -> None:
    a = _create(client, auth_headers, {**plan_body, "name": "a", "tags": {"team": "nlp"}}).json()
    b = _create(
        client, auth_headers, {**plan_body, "name": "b", "tags": {"team": "cv", "env": "prod"}}
    ).json()
    c = _create(
        client, auth_headers, {**plan_body, "name": "a", "tags": {"team": "cv", "env": "dev"}}
    ).json()
    _create(client, other_auth_headers, {**plan_body, "name": "a"})  # another project
    _set(db_session, b["id"], status="running")

    def ids(**params: Any) -> set[str]:
        response = client.get("/v1/jobs", params=params, headers=auth_headers)
        assert response.status_code == 200, response.text
        return set(_ids(response.json()))

    assert ids() == {a["id"], b["id"], c["id"]}
    assert ids(name="a") == {a["id"], c["id"]}
    assert ids(status="running") == {b["id"]}
    assert ids(status="queued,running") == {a["id"], b["id"], c["id"]}
    assert ids(status=["queued", "cancelled"]) == {a["id"], c["id"]}
    assert ids(kind="plan") == {a["id"], b["id"], c["id"]}
    assert ids(kind="analyze") == set()
    assert ids(tag="team:cv") == {b["id"], c["id"]}
    assert ids(tag=["team:cv", "env:prod"]) == {b["id"]}
    assert ids(tag="team:nope") == set()
    assert ids(name="a", tag="team:cv") == {c["id"]}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "sleeping"}, "query.status"),
        ({"kind": "train"}, "query.kind"),
        ({"tag": "no-colon"}, "query.tag"),
        ({"page_token": "garbage!!"}, "query.page_token"),
        ({"page_size": 0}, "query.page_size"),
        ({"page_size": "many"}, "query.page_size"),
    ],
)
def test_list_bad_parameters_are_422_naming_them(client, auth_headers, params, field) -> None:
    problem = assert_problem(client.get("/v1/jobs", params=params, headers=auth_headers), 422)
    assert field in error_fields(problem)


def test_page_token_is_bound_to_its_filters(client, auth_headers, plan_body) -> None:
    for _ in range(3):
        _create(client, auth_headers, plan_body)
    page = client.get("/v1/jobs", params={"page_size": 1}, headers=auth_headers).json()
    problem = assert_problem(
        client.get(
            "/v1/jobs",
            params={"page_size": 1, "page_token": page["next_page_token"], "name": "other"},
            headers=auth_headers,
        ),
        422,
    )
    assert error_fields(problem) == {"query.page_token"}


# --------------------------------------------------------------------------- cancel
def test_cancel_queued_job_is_immediate_then_409(client, auth_headers, plan_body) -> None:
    job = _create(client, auth_headers, plan_body).json()
    response = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth_headers)
    assert response.status_code == 200
    cancelled = response.json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"] is not None
    assert cancelled["cancel_requested"] is True
    problem = assert_problem(client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth_headers), 409)
    assert problem["job_status"] == "cancelled"


def test_cancel_running_job_sets_cancelling(client, auth_headers, plan_body, db_session) -> None:
    job = _create(client, auth_headers, plan_body).json()
    _set(db_session, job["id"], status="running", attempt=1, worker_id="w-1")
    response = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth_headers)
    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "cancelling" and body["cancel_requested"] is True
    assert body["finished_at"] is None
    again = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth_headers)
    assert again.status_code == 202 and again.json()["status"] == "cancelling"
    row = db_session.execute(
        text("SELECT status, cancel_requested, worker_id FROM job WHERE id = :id"),
        {"id": job["id"]},
    ).one()
    assert tuple(row) == ("cancelling", True, "w-1")


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_cancel_terminal_job_is_409(client, auth_headers, plan_body, db_session, status) -> None:
    job = _create(client, auth_headers, plan_body).json()
    _set(db_session, job["id"], status=status)
    assert_problem(client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth_headers), 409)


def test_cancel_other_project_job_is_404(
    client, auth_headers, other_auth_headers, plan_body, db_session
) -> None:
    job = _create(client, auth_headers, plan_body).json()
    assert_problem(client.post(f"/v1/jobs/{job['id']}/cancel", headers=other_auth_headers), 404)
    status = db_session.execute(
        text("SELECT status FROM job WHERE id = :id"), {"id": job["id"]}
    ).scalar_one()
    assert status == "queued"


# --------------------------------------------------------------------------- recommendation
def test_recommendation_409_until_succeeded(
    client, auth_headers, other_auth_headers, plan_body, db_session
) -> None:
    job = _create(client, auth_headers, plan_body).json()
    url = f"/v1/jobs/{job['id']}/recommendation"
    assert assert_problem(client.get(url, headers=auth_headers), 409)["job_status"] == "queued"
    _set(db_session, job["id"], status="running")
    assert_problem(client.get(url, headers=auth_headers), 409)
    _set(db_session, job["id"], status="succeeded", result={"recommendation": RECOMMENDATION})
    response = client.get(url, headers=auth_headers)
    assert response.status_code == 200
    # as stored, less the fields removed or renamed since (README, "Breaking changes")
    assert response.json() == without_removed_fields(RECOMMENDATION)
    assert_problem(client.get(url, headers=other_auth_headers), 404)


def test_recommendation_of_failed_job_is_409(client, auth_headers, plan_body, db_session) -> None:
    job = _create(client, auth_headers, plan_body).json()
    _set(
        db_session,
        job["id"],
        status="failed",
        error={"type": "worker-lost", "title": "Worker lost", "detail": "3 attempts"},
    )
    problem = assert_problem(
        client.get(f"/v1/jobs/{job['id']}/recommendation", headers=auth_headers), 409
    )
    assert problem["job_status"] == "failed"
    got = client.get(f"/v1/jobs/{job['id']}", headers=auth_headers).json()
    assert got["error"]["type"] == "worker-lost"


def test_plan_over_the_planner_workload_cap_is_422_naming_targets(client, auth_headers) -> None:
    """(N + P·N) × orderings above the planner's cap is refused before queueing."""
    body = {
        "kind": "plan",
        "measurements": {"per_sample_losses": [0.5] * 40_000},
        "targets": {"tolerances": [0.01], "orderings": 10_000},
    }
    problem = assert_problem(_create(client, auth_headers, body), 422)
    assert error_fields(problem) == {"body.targets"}
    assert "targets.orderings" in problem["errors"][0]["message"]
    listed = client.get("/v1/jobs", headers=auth_headers).json()
    assert listed["items"] == []
