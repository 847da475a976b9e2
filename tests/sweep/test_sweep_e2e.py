"""A batch sweep end to end over HTTP: the parent fans out, real workers train the points,
and a worker SIGKILLed in the middle loses nothing and duplicates nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live import Service, start_service, wait_terminal
from sqlalchemy import create_engine, text
from sweep_helpers import TINY_SPEC, api_key, counting_data

from curvplan_core.planner.branched_batch import nearest_power_of_two

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def service(sweep_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_service(sweep_database, tmp_path_factory.mktemp("sweep-e2e"))
    try:
        yield svc
    finally:
        svc.server.stop()
        svc.worker.stop()


@pytest.fixture(scope="module")
def client(service: Service) -> Iterator[httpx.Client]:
    key = api_key(service.database_url)
    with httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as c:
        yield c


def upload(client: httpx.Client, path: Path, kind: str) -> str:
    with path.open("rb") as fh:
        response = client.post(
            "/v1/artifacts",
            files={"file": (path.name, fh, "application/octet-stream")},
            data={"kind": kind},
        )
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


@pytest.fixture(scope="module")
def data_ids(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from curvplan_worker.curvature.data import save_dataset

    out = tmp_path_factory.mktemp("sweep-files")
    save_dataset(counting_data(128, 0), out / "train.safetensors")
    save_dataset(counting_data(32, 1), out / "eval.safetensors")
    return {
        "train_data": upload(client, out / "train.safetensors", "dataset"),
        "eval_data": upload(client, out / "eval.safetensors", "dataset"),
    }


def _sweep_body(data_ids: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "sweep",
        "name": "tiny-batch-sweep",
        "model": TINY_SPEC,
        **data_ids,
        "optimizer": {"name": "adamw", "lr": 0.03, "base_batch_size": 8, "warmup_steps": 5},
        "sweep": {
            "type": "batch",
            "target_loss": 0.3,
            "batch_sizes": [4, 8, 16, 32],
            "max_steps": 400,
            "eval_every": 2,
        },
    }


def _job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}")
    response.raise_for_status()
    return response.json()


def test_sigkill_during_a_sweep_finishes_every_point_and_the_parent_exactly_once(
    client: httpx.Client, service: Service, data_ids: dict[str, str]
) -> None:
    response = client.post("/v1/jobs", json=_sweep_body(data_ids))
    assert response.status_code == 202, response.text
    parent_id = response.json()["id"]
    deadline = time.monotonic() + 120
    while True:  # kill while the parent waits and a point trains
        job = _job(client, parent_id)
        children = job.get("children") or []
        if any(c["status"] == "running" for c in children):
            break
        assert job["status"] in ("queued", "running"), (job, service.logs())
        assert time.monotonic() < deadline, service.logs()
        time.sleep(0.05)
    assert job["progress"]["stage"] == "waiting for children"
    assert job["progress"]["points_total"] == 4
    service.worker.kill()
    service.worker = service.new_worker("worker-2.log")
    done = wait_terminal(client, parent_id, timeout=240)
    assert done["status"] == "succeeded", (done["error"], service.logs())

    engine = create_engine(service.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT j.id, j.parent_id, j.status, a.outcome FROM job j"
                    " JOIN job_attempt a ON a.job_id = j.id"
                    " WHERE j.id = :p OR j.parent_id = :p ORDER BY j.id, a.attempt"
                ),
                {"p": parent_id},
            ).all()
    finally:
        engine.dispose()
    by_job: dict[str, list[str]] = {}
    for row in rows:
        by_job.setdefault(str(row.id), []).append(row.outcome)
    assert len(by_job) == 5  # the parent and its four points, nothing duplicated
    for job_id, outcomes in by_job.items():
        assert outcomes.count("succeeded") == 1, (job_id, outcomes)
        assert outcomes[-1] == "succeeded"
    assert by_job[parent_id][0] == "fanned-out"
    assert by_job[parent_id].count("fanned-out") == 1  # the fan-out happened once

    sweep = done["result"]["sweep"]
    assert sweep["points_total"] == 4 and len(done["children"]) == 4
    assert {c["status"] for c in done["children"]} == {"succeeded"}
    used = [p for p in sweep["points"] if p["used_in_fit"]]
    steps = {p["result"]["batch_size"]: p["result"]["steps"] for p in used}
    assert len(steps) >= 3
    # More examples per step never needs more steps to the same loss (within noise).
    ordered = [steps[b] for b in sorted(steps)]
    assert ordered[0] > ordered[-1]
    fit = sweep["batch"]["fit"]
    assert fit["value"] > 0 and fit["s_min"] > 0
    assert sweep["b_simple_trend"], sweep


@pytest.fixture(scope="module")
def branch_checkpoints(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two saves of one tiny run: at initialisation (step 0) and after 30 Adam steps."""
    import torch

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.model import build_model
    from curvplan_worker.curvature.objective import dataset_loss, objective_for

    out = tmp_path_factory.mktemp("branch-checkpoints")
    model = build_model(TINY_SPEC, seed=3)
    save_checkpoint(model, out / "step_0.safetensors", step=0)
    data = counting_data(128, 0)
    objective = objective_for(TINY_SPEC)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        pick = torch.randint(0, 128, (16,), generator=gen)
        loss = dataset_loss(objective, model, data.inputs[pick], data.targets[pick])
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_checkpoint(model, out / "step_30.safetensors", step=30)
    return [upload(client, out / f"step_{s}.safetensors", "checkpoint") for s in (0, 30)]


def test_a_branch_sweep_gives_each_checkpoints_cbs_and_leads_an_analysis_batch(
    client: httpx.Client,
    service: Service,
    data_ids: dict[str, str],
    branch_checkpoints: list[str],
) -> None:
    body = {
        "kind": "sweep",
        "name": "tiny-branch-sweep",
        "model": TINY_SPEC,
        **data_ids,
        "checkpoints": branch_checkpoints,
        "optimizer": {"name": "adamw", "lr": 0.01, "base_batch_size": 8, "warmup_steps": 2},
        "sweep": {
            "type": "branch",
            "batch_sizes": [4, 8, 16],
            "window_tokens": 6 * 128,  # 128 examples: 32 steps at batch 4, 8 at batch 16
            "window_evals": 4,
            "tolerance": 0.05,
        },
    }
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    done = wait_terminal(client, response.json()["id"], timeout=120)
    assert done["status"] == "succeeded", (done["error"], service.logs())
    assert len(done["children"]) == 6 and {c["status"] for c in done["children"]} == {"succeeded"}
    branch = done["result"]["sweep"]["branch"]
    assert [c["step"] for c in branch["checkpoints"]] == [0, 30]  # read from the files
    for checkpoint in branch["checkpoints"]:
        curves = {c["batch_size"]: c for c in checkpoint["curves"]}
        assert set(curves) == {4, 8, 16}
        marks = [c["tokens"] for c in curves.values()]
        assert marks[0] == [0.0, 192.0, 384.0, 576.0, 768.0] and marks.count(marks[0]) == 3
        start = {c["losses"][0] for c in curves.values()}  # the same checkpoint, the same eval
        assert len(start) == 1 and checkpoint["loss"] == start.pop()
        for curve in curves.values():  # training from the checkpoint lowers the loss
            assert curve["losses"][-1] < curve["losses"][0]
        end = {b: c["losses"][-1] for b, c in curves.items()}
        if curves[4]["losses"][0] - end[4] <= 0.05:  # the reference made no progress
            assert checkpoint["status"] == "not_measured"
            assert checkpoint["critical_batch"] is None and checkpoint["crossing"] is None
            assert any("made no progress" in n for n in checkpoint["notes"])
            continue
        within = [b for b in (4, 8, 16) if end[b] - end[4] <= 0.05]
        assert checkpoint["critical_batch"] == max(within)  # the rule, on the real curves
        crossing = checkpoint["crossing"]  # inside the ladder's bracket, its status
        assert crossing["status"] == checkpoint["status"]
        if checkpoint["status"] == "measured":
            assert checkpoint["critical_batch"] <= crossing["value"] < checkpoint["next_batch"]
        else:
            assert crossing["value"] == checkpoint["critical_batch"]
        assert checkpoint["efficiency"]["value"] > 0
        assert {c.get("reference_reach") for b, c in curves.items() if b > 4} <= {
            "inside",
            "kept_up",
            "not_reached",
        }
    assert branch["examples_processed"] == 2 * 3 * 128
    stages = branch["warmup_schedule"]
    assert stages and stages[0]["from_step"] == 0

    analyze = {
        "kind": "analyze",
        "model": TINY_SPEC,
        "checkpoint": branch_checkpoints[1],
        "dataset": data_ids["eval_data"],
        "sweeps": [done["id"]],
        "options": {  # only budget.batch is under test: the cheapest analysis
            "fan_out": False,
            "trace_probes": 2,
            "dense": "off",
            "per_sample": False,
            "gradient_noise": False,
            "bounds": False,
            "off_diagonal": False,
        },
    }
    response = client.post("/v1/jobs", json=analyze)
    assert response.status_code == 202, response.text
    analysed = wait_terminal(client, response.json()["id"], timeout=120)
    assert analysed["status"] == "succeeded", (analysed["error"], service.logs())
    batch = analysed["result"]["recommendation"]["budget"]["batch"]
    assert batch["source"] == "branch_sweep"
    measured = [c for c in branch["checkpoints"] if c["status"] != "not_measured"]
    latest = measured[-1]  # the latest measured checkpoint; the ε-crossing leads (BRANCH_LEAD)
    if latest is not branch["checkpoints"][-1]:
        warnings = analysed["result"]["recommendation"]["budget"]["warnings"]
        assert any("not measured at step 30" in w for w in warnings), warnings
    assert batch["critical_method"] == "eps_crossing"
    assert batch["critical"] == pytest.approx(latest["crossing"]["value"])
    assert batch["recommended"] == nearest_power_of_two(latest["crossing"]["value"])
    assert batch["warmup_schedule"] == stages


def test_a_data_sweep_runs_a_second_round_on_real_workers(
    client: httpx.Client, service: Service, data_ids: dict[str, str]
) -> None:
    """A target above every measured loss: the fitted size lies below the smallest subset,
    so the parent queues a round of halvings (down to the batch size) and ends after it."""
    body = {
        "kind": "sweep",
        "name": "tiny-data-sweep",
        "model": TINY_SPEC,
        **data_ids,
        "optimizer": {"lr": 0.03, "base_batch_size": 4, "warmup_steps": 2, "lr_grid": [1.0]},
        "sweep": {
            "type": "data",
            "target_loss": 50.0,
            "data_sizes": [8, 16, 32, 64],
            "batch_size": 4,
            "epochs": 2,
            "min_steps": 10,
            "eval_every": 5,
        },
    }
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    done = wait_terminal(client, response.json()["id"], timeout=240)
    assert done["status"] == "succeeded", (done["error"], service.logs())
    data = done["result"]["sweep"]["data"]
    assert [r["data_sizes"] for r in data["rounds"]] == [[8, 16, 32, 64], [4]]
    assert len(done["children"]) == 5
    # steps = max(10, ceil(2 · D / 4)): each run trained exactly its own schedule
    assert data["steps_per_size"] == {"4": 10, "8": 10, "16": 10, "32": 16, "64": 32}
    for point in done["result"]["sweep"]["points"]:
        d = point["result"]["data_size"]
        assert point["result"]["eval_steps"][-1] == max(10, -(-2 * d // 4))
    # no smaller subset can be trained: the sweep says so instead of extrapolating silently
    assert data["next_round_sizes"] is None
    assert any("no next round" in note for note in done["result"]["sweep"]["notes"])


def test_an_analysis_combines_two_data_sweeps_of_one_setup(
    client: httpx.Client,
    service: Service,
    data_ids: dict[str, str],
    branch_checkpoints: list[str],
) -> None:
    """A first round and a next round run as two sweeps (one round each): given both, the
    analysis fits one L(D) over every size of the two and says where it came from."""

    def data_sweep(sizes: list[int]) -> str:
        body = {
            "kind": "sweep",
            "model": TINY_SPEC,
            **data_ids,
            "optimizer": {"lr": 0.03, "base_batch_size": 4, "warmup_steps": 2, "lr_grid": [1.0]},
            "sweep": {
                "type": "data",
                "target_loss": 50.0,
                "data_sizes": sizes,
                "batch_size": 4,
                "epochs": 2,
                "min_steps": 10,
                "eval_every": 5,
                "max_rounds": 1,  # not part of the setup: the two still combine
            },
        }
        response = client.post("/v1/jobs", json=body)
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    first, second = data_sweep([8, 16, 32, 64]), data_sweep([6, 12, 24, 48])
    for job_id in (first, second):
        done = wait_terminal(client, job_id, timeout=240)
        assert done["status"] == "succeeded", (done["error"], service.logs())
    analyze = {
        "kind": "analyze",
        "model": TINY_SPEC,
        "checkpoint": branch_checkpoints[1],
        "dataset": data_ids["eval_data"],
        "sweeps": [first, second],
        "options": {  # only the sweeps' tables are under test: the cheapest analysis
            "fan_out": False,
            "trace_probes": 2,
            "dense": "off",
            "per_sample": False,
            "gradient_noise": False,
            "bounds": False,
            "off_diagonal": False,
        },
    }
    response = client.post("/v1/jobs", json=analyze)
    assert response.status_code == 202, response.text
    analysed = wait_terminal(client, response.json()["id"], timeout=120)
    assert analysed["status"] == "succeeded", (analysed["error"], service.logs())
    result = analysed["result"]
    assert result["sweeps_used"] == {"loss_vs_data": [first, second]}
    table = result["planner_inputs"]["fields"]["loss_vs_data"]
    assert [p["n_samples"] for p in table] == [6, 8, 12, 16, 24, 32, 48, 64]
    assert any("2 data sweeps" in note for note in result["notes"])
    assert result["recommendation"]["budget"]["data"]["measured_sizes"] == [6, 64]
