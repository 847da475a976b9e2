"""An agent sweep end to end: ``runner: agent`` → ``curvplan agent`` running the example
trainer (examples/agent_trainer.py) → the sweep's fit and budget. An agent SIGKILLed while it
trains a point loses nothing and duplicates nothing: the lease runs out, the reaper queues the
point again, another agent trains it once more, and the killed run does not survive its agent."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live import Service, start_service, wait_terminal
from live_plugin import Proc
from sqlalchemy import create_engine, text
from sweep_helpers import api_key

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "examples" / "agent_trainer.py"
TARGET = 0.2
COMMAND = (
    f"{sys.executable} {TRAINER} --batch-size {{batch_size}} --max-examples {{data_size}} "
    "--lr {lr} --max-steps {max_steps} --seed {seed} --out {output_dir} "
    "--eval-every {eval_every} --optimizer {optimizer} --target-loss {target_loss}"
)


@pytest.fixture(scope="module")
def service(sweep_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_service(sweep_database, tmp_path_factory.mktemp("agent-e2e"))
    try:
        yield svc
    finally:
        svc.server.stop()
        svc.worker.stop()


def _agent(service: Service, key: str, out: Path, log: str, *extra: str) -> Proc:
    env = {**service.env, "CURVPLAN_URL": service.url, "CURVPLAN_API_KEY": key}
    args = ["agent", "--default", "data_size=0", "--lease-seconds", "2", "--poll-interval"]
    proc = Proc([*args, "0.1", "--out-dir", str(out), *extra], env, out.parent / log)
    proc.start()
    return proc


def _first_reaching(records: list[dict[str, Any]], target: float) -> float:
    """Steps to the target, by hand: the first evaluation at or below it, interpolated
    linearly in loss from the evaluation before (the oracle of the point's result)."""
    for prev, rec in itertools.pairwise(records):
        if rec["loss"] <= target:
            frac = (prev["loss"] - target) / (prev["loss"] - rec["loss"])
            return prev["step"] + frac * (rec["step"] - prev["step"])
    raise AssertionError("no record reached the target")


def test_an_agent_sweep_ends_in_a_budget_and_a_killed_agent_loses_nothing(
    service: Service, tmp_path: Path
) -> None:
    key = api_key(service.database_url)
    client = httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    submit = subprocess.run(
        [sys.executable, "-m", "curvplan.cli", "sweep", "--runner", "agent", "--type", "batch",
         "--target-loss", str(TARGET), "--batch-sizes", "4,8,16", "--lr", "0.05",
         "--base-batch-size", "8", "--warmup-steps", "0", "--max-steps", "400",
         "--eval-every", "2", "--name", "agent-batch-sweep", "--json"],
        env={**service.env, "CURVPLAN_URL": service.url, "CURVPLAN_API_KEY": key},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    parent_id = json.loads(submit.stdout)["id"]
    request = client.get(f"/v1/jobs/{parent_id}").json()["request"]
    assert request["runner"] == "agent" and "model" not in request and "train_data" not in request
    deadline = time.monotonic() + 60
    while not (children := client.get(f"/v1/jobs/{parent_id}").json().get("children")):
        assert time.monotonic() < deadline, service.logs()
        time.sleep(0.1)
    time.sleep(1.0)  # the built-in worker polls every 0.1 s: it would have claimed by now
    points = [client.get(f"/v1/jobs/{c['id']}").json() for c in children]
    assert [(p["queue"], p["status"], p["attempt"]) for p in points] == [("agent", "queued", 0)] * 3

    refused = subprocess.run(
        [sys.executable, "-m", "curvplan.cli", "agent", "--command", COMMAND],
        env={**service.env, "CURVPLAN_URL": service.url, "CURVPLAN_API_KEY": "cp_not-a-key"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "refused the API key" in refused.stderr, refused.stderr

    runs_a, runs_b = tmp_path / "agent-a", tmp_path / "agent-b"
    agent_a = _agent(
        service, key, runs_a, "agent-a.log", "--command", COMMAND + " --step-seconds 0.1"
    )
    deadline = time.monotonic() + 90
    while True:  # kill it once the point it trains has reported an evaluation
        running = [
            job
            for c in children
            if (job := client.get(f"/v1/jobs/{c['id']}").json())["status"] == "running"
            and (job["progress"] or {}).get("fraction")
        ]
        if running:
            break
        assert time.monotonic() < deadline, agent_a.tail()
        time.sleep(0.1)
    (killed,) = running
    agent_a.kill()
    killed_dir = runs_a / f"{killed['id']}-1"
    assert (killed_dir / "losses.jsonl").exists()

    agent_b = _agent(service, key, runs_b, "agent-b.log", "--command", COMMAND, "--idle-exit", "60")
    try:
        done = wait_terminal(client, parent_id, timeout=180)
    finally:
        agent_b.stop()
    assert done["status"] == "succeeded", (done["error"], service.logs(), agent_b.tail())

    # the killed run died with its agent: it never finished (it would have within ~6 s)
    assert not (killed_dir / "final.json").exists(), agent_a.tail()
    engine = create_engine(service.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT j.id, j.attempt, a.worker_id, a.outcome FROM job j"
                    " JOIN job_attempt a ON a.job_id = j.id"
                    " WHERE j.parent_id = :p ORDER BY j.id, a.attempt"
                ),
                {"p": parent_id},
            ).all()
    finally:
        engine.dispose()
    outcomes: dict[str, list[str]] = {}
    agents: dict[str, list[str]] = {}
    for row in rows:
        outcomes.setdefault(str(row.id), []).append(row.outcome)
        agents.setdefault(str(row.id), []).append(row.worker_id)
    assert outcomes.pop(killed["id"]) == ["lease-lost", "succeeded"]
    assert agents[killed["id"]][0] != agents[killed["id"]][1]  # agent B ran it the 2nd time
    assert list(outcomes.values()) == [["succeeded"]] * 2  # the others: once, first time

    sweep = done["result"]["sweep"]
    assert sweep["points_total"] == 3 and sweep["points_used"] == 3
    for point in sweep["points"]:
        job = client.get(f"/v1/jobs/{point['job_id']}").json()
        lines = (runs_b / f"{job['id']}-{job['attempt']}" / "losses.jsonl").read_text()
        records = [json.loads(line) for line in lines.splitlines()]
        result = point["result"]
        assert result["steps"] == pytest.approx(_first_reaching(records, TARGET))
        assert result["eval_losses"] == [r["loss"] for r in records]
        assert result["reached_target"] and not result["censored"]
    steps = sorted((p["result"]["batch_size"], p["result"]["steps"]) for p in sweep["points"])
    assert steps[0][1] > steps[-1][1]  # a larger batch needs fewer steps to the same loss
    table = [(row["batch_size"], row["steps"]) for row in sweep["batch"]["steps_at"]]
    assert table == steps
    batch = done["result"]["recommendation"]["budget"]["batch"]
    assert batch["source"] == "batch_sweep", batch
    assert done["result"]["measurements"]["steps_to_target"] == sweep["batch"]["steps_at"]
