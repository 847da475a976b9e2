"""The agent endpoints on the real queue SQL: an agent sweep's points wait in the agent queue
(no worker claims them), only agents of the sweep's project claim them, and every write after a
claim is fenced on the agent and the attempt."""

from __future__ import annotations

import shlex
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from curvplan.types.jobs import SweepPointJobCreate
from curvplan.types.sweep import OptimizerSpec, PointSettings
from curvplan_core.jobs import lifecycle

SWEEP = {
    "kind": "sweep",
    "runner": "agent",
    "name": "agent-sweep",
    "optimizer": {"lr": 0.05, "base_batch_size": 8},
    "sweep": {"type": "batch", "target_loss": 0.5, "batch_sizes": [4, 8, 16], "max_steps": 50},
}


def _fan_out(client: Any, headers: dict[str, str], db_session: Any) -> tuple[str, list[str]]:
    """Submit an agent sweep and fan it out as its worker would: one point per batch size."""
    response = client.post("/v1/jobs", json=SWEEP, headers=headers)
    assert response.status_code == 202, response.text
    conn = db_session.connection()
    claimed = lifecycle.claim(conn, "fan-out-worker", ["cpu"], 30.0)
    assert claimed is not None and str(claimed.fence.job_id) == response.json()["id"]
    children = []
    for b in (4, 8, 16):
        point = PointSettings(
            type="batch", batch_size=b, lr=0.05, target_loss=0.5, max_steps=50, eval_every=5
        )
        request = SweepPointJobCreate(
            kind="sweep_point", runner="agent", point=point, optimizer=OptimizerSpec(lr=0.05)
        )
        stored = request.model_dump(mode="json", exclude_none=True)
        children.append({"kind": "sweep_point", "request": stored, "name": f"B={b}"})
    assert lifecycle.wait_for_children(conn, claimed.fence, children) == "running"
    db_session.commit()
    parent = client.get(f"/v1/jobs/{claimed.fence.job_id}", headers=headers).json()
    return parent["id"], [c["id"] for c in parent["children"]]


def _register(client: Any, headers: dict[str, str]) -> str:
    response = client.post("/v1/agents", json={"hostname": "h", "pid": 1}, headers=headers)
    assert response.status_code == 201, response.text
    assert response.json()["project"].startswith(("proj-", "other-"))  # the key's project
    return str(response.json()["id"])


def _claim(client: Any, agent: str, headers: dict[str, str]) -> dict[str, Any] | None:
    response = client.post(f"/v1/agents/{agent}/claim", json={}, headers=headers)
    assert response.status_code == 200, response.text
    job: dict[str, Any] | None = response.json()["job"]
    return job


def _post(client: Any, agent: str, job: dict[str, Any], action: str, headers: dict[str, str],
          **body: Any) -> Any:  # fmt: skip
    return client.post(
        f"/v1/agents/{agent}/jobs/{job['job_id']}/{action}",
        json={"attempt": job["attempt"], **body},
        headers=headers,
    )


def test_agent_points_wait_for_agents_of_their_project_only(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], db_session: Any
) -> None:
    parent, points = _fan_out(client, auth_headers, db_session)
    queues = {client.get(f"/v1/jobs/{p}", headers=auth_headers).json()["queue"] for p in points}
    assert queues == {"agent"}
    # a worker of every queue claims none of them (it may claim what other tests left queued in
    # the session's database: claim until nothing is left; this test's transaction rolls back)
    seen: set[str] = set()
    while (job := lifecycle.claim(db_session.connection(), "w", ["cpu", "gpu"], 30.0)) is not None:
        seen.add(str(job.fence.job_id))
    assert seen.isdisjoint(points)
    assert _claim(client, _register(client, other_auth_headers), other_auth_headers) is None
    agent = _register(client, auth_headers)
    claimed = [_claim(client, agent, auth_headers) for _ in points]
    assert [c["job_id"] for c in claimed if c] == points  # oldest first
    assert _claim(client, agent, auth_headers) is None
    first = claimed[0]
    assert first is not None and first["sweep_id"] == parent and first["attempt"] == 1
    assert first["point"]["batch_size"] == 4 and first["optimizer"]["lr"] == 0.05
    workers = client.get("/v1/workers", headers=auth_headers)
    assert workers.status_code == 403  # the agent is listed to operators only, like workers


def test_fenced_writes_complete_fail_and_retry_a_point(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], db_session: Any
) -> None:
    parent, points = _fan_out(client, auth_headers, db_session)
    agent = _register(client, auth_headers)
    one, two, three = (_claim(client, agent, auth_headers) for _ in points)
    assert one and two and three
    stale = {**one, "attempt": 2}
    assert _post(client, agent, stale, "heartbeat", auth_headers).status_code == 409
    assert _post(client, agent, one, "heartbeat", other_auth_headers).status_code == 404
    assert _post(client, "agent-unknown", one, "heartbeat", auth_headers).status_code == 404
    assert client.post(f"/v1/agents/{agent}/claim", json={}).status_code == 401
    beat = _post(
        client, agent, one, "heartbeat", auth_headers, progress={"fraction": 0.5, "stage": "x"}
    )
    assert beat.status_code == 200 and beat.json()["cancel_requested"] is False
    records = [{"step": 0, "loss": 1.0}, {"step": 10, "loss": 0.7}, {"step": 20, "loss": 0.4}]
    empty = _post(client, agent, one, "complete", auth_headers, records=[], seconds=1.0)
    assert empty.status_code == 422 and empty.json()["errors"][0]["field"] == "body.records"
    done = _post(client, agent, one, "complete", auth_headers, records=records, seconds=3.0)
    assert done.status_code == 200 and done.json()["status"] == "succeeded", done.text
    again = _post(client, agent, one, "complete", auth_headers, records=records, seconds=3.0)
    assert again.status_code == 409  # the attempt ended: nothing is written twice
    job = client.get(f"/v1/jobs/{one['job_id']}", headers=auth_headers).json()
    point = job["result"]["point"]
    assert point["steps"] == pytest.approx(10 + (0.7 - 0.5) / 0.3 * 10)
    assert point["reached_target"] and point["batch_size"] == 4

    stderr = "\n".join(f"line {i}" for i in range(20))
    error = {"type": "command-failed", "title": "The command failed", "detail": stderr}
    failed = _post(client, agent, two, "fail", auth_headers, error=error)
    assert failed.json()["status"] == "failed"
    job = client.get(f"/v1/jobs/{two['job_id']}", headers=auth_headers).json()
    assert job["error"]["type"] == "command-failed" and job["error"]["detail"] == stderr
    killed = {"type": "command-killed", "title": "Killed", "detail": "signal 9"}
    retried = _post(client, agent, three, "fail", auth_headers, error=killed, retry=True)
    assert retried.json()["status"] == "queued"
    row = db_session.execute(
        text("SELECT status, attempt FROM job WHERE id = :id"), {"id": uuid.UUID(three["job_id"])}
    ).one()
    assert (row.status, row.attempt) == ("queued", 1)
    parent_job = client.get(f"/v1/jobs/{parent}", headers=auth_headers).json()
    assert parent_job["progress"]["points_done"] == 2  # a failed point ends; the sweep waits on


def test_a_cancelled_sweep_tells_its_agent_and_a_release_requeues_at_once(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    parent, _points = _fan_out(client, auth_headers, db_session)
    agent = _register(client, auth_headers)
    first = _claim(client, agent, auth_headers)
    second = _claim(client, agent, auth_headers)
    assert first and second
    released = _post(client, agent, second, "release", auth_headers)
    assert released.json()["status"] == "queued"
    again = _claim(client, agent, auth_headers)
    assert again and again["job_id"] == second["job_id"] and again["attempt"] == 2
    assert client.post(f"/v1/jobs/{parent}/cancel", headers=auth_headers).status_code == 202
    beat = _post(client, agent, first, "heartbeat", auth_headers)
    assert beat.json() | {"lease_seconds": 0} == {
        "status": "cancelling",
        "cancel_requested": True,
        "lease_seconds": 0,
    }
    assert _post(client, agent, first, "cancelled", auth_headers).json()["status"] == "cancelled"
    assert client.delete(f"/v1/agents/{agent}", headers=auth_headers).status_code == 204


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"train_data": str(uuid.uuid4())}, "body.train_data", "drop train_data"),
        ({"runner": "builtin"}, "body.model", "Field required"),
        ({"sweep": {"type": "data"}}, "body.sweep", "sweep.data_sizes: required"),
        (
            {"sweep": {"type": "branch", "window_tokens": 100}, "checkpoints": [str(uuid.uuid4())]},
            "body.sweep",
            "sweep.type: an agent sweep",
        ),
    ],
)
def test_an_agent_sweep_refuses_what_it_cannot_use(
    client: Any, auth_headers: dict[str, str], change: dict[str, Any], field: str, message: str
) -> None:
    response = client.post("/v1/jobs", json={**SWEEP, **change}, headers=auth_headers)
    assert response.status_code == 422, response.text
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert field in errors and message in errors[field], errors


class _Via(httpx.BaseTransport):
    """The client library's requests, sent through the test app's client."""

    def __init__(self, test_client: Any) -> None:
        self.test_client = test_client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.test_client.request(
            request.method, str(request.url), content=request.read(), headers=request.headers
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def test_the_agent_loop_fails_a_point_whose_command_exits_non_zero_with_its_stderr(
    client: Any, api_key: str, auth_headers: dict[str, str], db_session: Any, tmp_path: Path
) -> None:
    """The agent's own loop, in process, against the API: every point's command exits 4, so
    every point fails with its last 20 stderr lines, and the sweep is queued for its fan-in
    (which fails it with too-few-points naming them) instead of waiting forever."""
    from curvplan.client.agents import AgentAPI
    from curvplan.client.sync import Client
    from curvplan.commands.agent import _loop

    parent, points = _fan_out(client, auth_headers, db_session)
    code = "import sys\nfor i in range(30): print('oops', i, file=sys.stderr)\nsys.exit(4)"
    command = f"{sys.executable} -c {shlex.quote(code)} --batch-size {{batch_size}}"
    with Client("http://testserver", api_key, transport=_Via(client)) as http:
        api = AgentAPI(http)
        _loop(api, command, {}, tmp_path, threading.Event(), 3, None, 0.05, 1.0)
    for point in points:
        job = client.get(f"/v1/jobs/{point}", headers=auth_headers).json()
        assert job["status"] == "failed" and job["error"]["type"] == "command-failed", job
        detail = job["error"]["detail"]
        assert "exited with status 4" in detail and "--batch-size" in detail
        assert "oops 29" in detail and "oops 10" in detail and "oops 9\n" not in detail
    sweep = client.get(f"/v1/jobs/{parent}", headers=auth_headers).json()
    assert sweep["status"] == "queued" and sweep["progress"]["points_failed"] == 3, sweep
