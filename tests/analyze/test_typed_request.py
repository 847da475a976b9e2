"""Typed end to end: the request a client sends is stored as its create model's JSON, and each
attempt of the job parses it once, into that model, which flows to the engine unparsed.

The API runs in-process on a database of this module alone; the worker is a real
``WorkerSlot`` in a fresh process (``typed_walk.py``) whose attempts are forked children
(``fork``: they inherit its counter). One analysis walks its whole fan-out, planned at
submission: each ``analyze_blocks`` child and the fan-in, with an intermediate checkpoint (the
gradient-noise stage builds the model again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import live_plugin
import pytest
from analyze_files import SPEC
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from typed_walk import counting_validator

from curvplan.types.jobs import CLIENT_JOB_CREATE_ADAPTER, AnalyzeJobCreate, PlanJobCreate
from curvplan.types.spec import ModelSpec
from curvplan_core.db import make_engine
from curvplan_worker.child import request_json
from curvplan_worker.kinds import load_request

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

OPTIONS: dict[str, Any] = {
    "precision": "float64",
    "seed": 3,
    "dense": "off",
    "max_iter": 40,
    "trace_probes": 4,
    "off_diagonal": [["layers.0.q", "layers.0.k"]],
    "per_sample": False,
    "gradient_noise": False,
    "bounds": False,
    "noise_grad_examples": 4,
    "noise_hessian_examples": 2,
    "noise_adaptive": False,
    "fan_out": True,
    "fan_out_groups": 2,
    "bound_options": {"mode": "exact", "max_samples": 4},
}


@pytest.fixture(scope="module")
def typed_database(pg_admin_url: str) -> Iterator[str]:
    """A migrated database of this module alone (its worker slot claims every job in it)."""
    with live_plugin.private_database(pg_admin_url, "curvplan_typed") as url:
        yield url


@pytest.fixture
def service(
    typed_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[TestClient, dict[str, str], Engine]]:
    """The API in-process (every request committed) and the worker's environment."""
    from curvplan_core.config import Settings, get_settings
    from curvplan_server.main import create_app

    data_dir = tmp_path / "data"
    for name, value in {
        "DATABASE_URL": typed_database,
        "CURVPLAN_DATA_DIR": str(data_dir),
        "CURVPLAN_WORKER_SELF_TEST": "false",
        "CURVPLAN_WORKER_THREADS": "1",
        "CURVPLAN_WORKER_DEVICE": "cpu",
    }.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    settings = Settings(
        database_url=typed_database, data_dir=data_dir, auth_disabled=False, job_notify=False
    )
    key = live_plugin.make_api_key(typed_database, f"typed-{uuid.uuid4().hex[:8]}")
    engine = make_engine(typed_database)
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, {"Authorization": f"Bearer {key}"}, engine
    app.state.engine.dispose()
    engine.dispose()
    get_settings.cache_clear()


@pytest.fixture
def spec_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every validation of a ``ModelSpec`` (``model_validate``, ``model_validate_json``, the
    constructor) appends a line to ``<dir>/<pid>``, in this process and in forked children."""
    counts = tmp_path / "spec-parses"
    counts.mkdir()
    monkeypatch.setattr(ModelSpec, "__pydantic_validator__", counting_validator(counts))
    return counts


def _upload(client: TestClient, headers: dict[str, str], path: Path, kind: str) -> str:
    with path.open("rb") as f:
        answer = client.post(
            "/v1/artifacts",
            headers=headers,
            files={"file": (path.name, f, "application/octet-stream")},
            data={"kind": kind},
        )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _stored(engine: Engine, job_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT kind, status, request, error FROM job WHERE id = :id"), {"id": job_id}
        ).one()


def _run_queue(url: str, data_dir: Path, counts: Path) -> list[str]:
    """Every runnable job, run by one worker slot in a fresh process (``typed_walk.py``)."""
    walk = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("typed_walk.py")), url, str(data_dir),
         str(counts)],
        capture_output=True, text=True, timeout=240, env=os.environ.copy(),
    )  # fmt: skip
    assert walk.returncode == 0, walk.stderr[-3000:]
    return list(json.loads(walk.stdout.strip().splitlines()[-1]))


def test_each_attempt_of_an_analysis_parses_its_model_spec_once(
    service: tuple[TestClient, dict[str, str], Engine],
    spec_parses: Path,
    tmp_path: Path,
    typed_database: str,
) -> None:
    from analyze_files import write_analyze_files

    client, headers, engine = service
    files = write_analyze_files(tmp_path / "files")
    checkpoint = _upload(client, headers, files["checkpoint"], "checkpoint")
    dataset = _upload(client, headers, files["data"], "dataset")
    body = {
        "kind": "analyze",
        "model": SPEC,
        "checkpoint": checkpoint,
        "dataset": dataset,
        "intermediate_checkpoints": [checkpoint],
        "options": OPTIONS,
        "targets": {"tolerances": [0.05], "radius": 0.05, "orderings": 4, "bootstrap": 10},
    }
    for stale in spec_parses.iterdir():  # the model files were written with the engine
        stale.unlink()
    answer = client.post("/v1/jobs", headers=headers, json=body)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    # The API validated the body once and used that model throughout: the size check, the
    # admission and the two analyze_blocks children it created at submission.
    assert (spec_parses / str(os.getpid())).read_text().splitlines() == ["1"]

    # What the API stored (JSONB) is the validated model's JSON: it parses back unchanged.
    row = _stored(engine, job_id)
    validated = CLIENT_JOB_CREATE_ADAPTER.validate_json(json.dumps(body))
    parsed = load_request(row.kind, request_json(row.kind, row.request))
    assert isinstance(parsed, AnalyzeJobCreate)
    assert parsed == validated
    assert parsed.model_dump(mode="json", exclude_unset=True) == row.request
    for stale in spec_parses.iterdir():  # the API's and this test's own parses
        stale.unlink()

    kinds = _run_queue(typed_database, tmp_path / "data", spec_parses)
    row = _stored(engine, job_id)
    assert row.status == "succeeded", row.error
    # fanned out at submission: the two block groups, then the parent's one attempt (fan-in)
    assert kinds == ["analyze_blocks", "analyze_blocks", "analyze"]
    per_attempt = {p.name: len(p.read_text().splitlines()) for p in spec_parses.iterdir()}
    assert len(per_attempt) == len(kinds), per_attempt  # one child process per attempt
    # once each, the fan-in included: it reads its children's requests with its own model
    assert set(per_attempt.values()) == {1}, per_attempt

    # A re-plan is stored with from_job and the measurements the API copied: it still parses.
    replan = {"kind": "plan", "from_job": job_id, "targets": {"tolerances": [0.1]}}
    answer = client.post("/v1/jobs", headers=headers, json=replan)
    assert answer.status_code == 202, answer.text
    row = _stored(engine, answer.json()["id"])
    assert row.request["from_job"] == job_id and row.request["measurements"]
    parsed_plan = load_request("plan", request_json(row.kind, row.request))
    assert isinstance(parsed_plan, PlanJobCreate) and parsed_plan.measurements is not None
    assert _run_queue(typed_database, tmp_path / "data", spec_parses) == ["plan"]
    assert _stored(engine, answer.json()["id"]).status == "succeeded"
