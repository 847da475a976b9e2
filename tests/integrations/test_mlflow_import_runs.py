"""``curvplan plan --from-mlflow`` against a real ``mlflow server``: runs logged by a real tiny
training loop (minibatch SGD on a linear regression, numpy) at several batch sizes and
training-set sizes, read back and planned by the live service in one command.

The oracle of the steps-to-target table is the training loop's own in-memory history (the
first evaluation at or below the target), not what MLflow returns. The loop's learning rate
η(B) = η_max·B/(B + B₀) makes the deterministic part of the step count S ∝ 1/η =
S_min(1 + B₀/B), McCandlish et al. (2018)'s eq. 2.11 with B_crit = B₀, so the plan's
critical batch must come out near B₀."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli
from live_plugin import LiveService

import curvplan

pytestmark = pytest.mark.e2e

mlflow = pytest.importorskip("mlflow")
from mlflow.entities import Metric, Param  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from curvplan.integrations.mlflow_runs import read_experiment_runs  # noqa: E402
from curvplan.runs import RunsInputError  # noqa: E402

FEATURES, NOISE = 10, 1.0
POOL = 100_000  # the batch runs' training set (sampled with replacement)
TARGET = 0.6  # irreducible loss σ²/2 = 0.5
B0, LR_MAX = 32, 0.02  # η(B) = LR_MAX·B/(B + B0): B_crit = B0
BATCH_SIZES = (4, 8, 16, 32, 64, 128, 256)
DATA_SIZES = (32, 64, 128, 256, 512, 1024)
EVAL_EVERY, DATA_EVAL_EVERY = 5, 20


@dataclass
class Logged:
    name: str
    params: dict[str, str]
    history: list[tuple[int, float]]


class TinyRegression:
    """y = x·w* + ε, the loss ½(y − x·w)², evaluated on 4000 held-out examples."""

    def __init__(self) -> None:
        self.w_star = np.random.default_rng(0).normal(size=FEATURES)
        self.x_eval, self.y_eval = self.sample(4000, np.random.default_rng(1))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(n, FEATURES))
        return x, x @ self.w_star + NOISE * rng.normal(size=n)

    def eval_loss(self, w: np.ndarray) -> float:
        r = self.x_eval @ w - self.y_eval
        return 0.5 * float(r @ r) / r.size

    def batch_run(self, batch: int, lr: float, max_steps: int) -> list[tuple[int, float]]:
        """Trained until the first evaluation at or below TARGET (a batch sweep's run)."""
        rng = np.random.default_rng(100 + batch)
        x, y = self.sample(POOL, rng)
        w, history = np.zeros(FEATURES), []
        for step in range(1, max_steps + 1):
            idx = rng.integers(0, POOL, size=batch)
            w -= lr * x[idx].T @ (x[idx] @ w - y[idx]) / batch
            if step % EVAL_EVERY == 0:
                history.append((step, self.eval_loss(w)))
                if history[-1][1] <= TARGET:
                    break
        return history

    def data_run(self, size: int, batch: int = 16, epochs: int = 60) -> list[tuple[int, float]]:
        """``epochs`` over ``size`` examples, the learning rate cosine-decayed to 0."""
        rng = np.random.default_rng(200 + size)
        x, y = self.sample(size, rng)
        w, history, steps = np.zeros(FEATURES), [], epochs * max(1, size // batch)
        for step in range(1, steps + 1):
            idx = rng.integers(0, size, size=batch)
            lr = 0.05 * 0.5 * (1 + np.cos(np.pi * step / steps))
            w -= lr * x[idx].T @ (x[idx] @ w - y[idx]) / batch
            if step % DATA_EVAL_EVERY == 0 or step == steps:
                history.append((step, self.eval_loss(w)))
        return history


def training_runs() -> list[Logged]:
    task = TinyRegression()
    runs = []
    for i, b in enumerate(BATCH_SIZES):
        lr = LR_MAX * b / (b + B0)
        # half log the global batch, half a Hugging Face-style per-device batch × world size
        sizes = (
            {"batch_size": str(b)}
            if i % 2
            else {"per_device_train_batch_size": str(b // 2), "world_size": "2"}
        )
        params = {**sizes, "learning_rate": repr(lr), "train_samples": str(POOL)}
        runs.append(Logged(f"batch-{b}", params, task.batch_run(b, lr, 4000)))
    for d in DATA_SIZES:
        params = {"batch_size": "16", "learning_rate": "0.05", "train_samples": str(d)}
        runs.append(Logged(f"data-{d}", params, task.data_run(d)))
    return runs


def bad_runs() -> list[Logged]:
    task = TinyRegression()
    return [  # no batch size, no dataset size; too small a learning rate to reach the target
        Logged("no-params", {"learning_rate": "0.01"}, task.batch_run(8, 0.01, 200)),
        Logged("never", {"batch_size": "8", "learning_rate": "1e-4"}, task.batch_run(8, 1e-4, 50)),
    ]


def log_runs(tracker: MlflowClient, experiment: str, runs: list[Logged]) -> dict[str, str]:
    """Each run in MLflow as a training script logs it: params, eval_loss per step, FINISHED."""
    exp_id = tracker.create_experiment(experiment)
    ids = {}
    for run in runs:
        rid = tracker.create_run(exp_id, run_name=run.name).info.run_id
        now = int(time.time() * 1000)
        tracker.log_batch(
            rid,
            metrics=[Metric("eval_loss", loss, now + i, step) for i, (step, loss) in
                     enumerate(run.history)],
            params=[Param(k, v) for k, v in run.params.items()],
        )  # fmt: skip
        tracker.set_terminated(rid, "FINISHED")
        ids[run.name] = rid
    return ids


def expected_steps(runs: list[Logged]) -> list[dict[str, float]]:
    """The oracle: from the loop's own histories, the first step at or below TARGET and the
    evaluation interval before it."""
    rows = []
    for run in runs:
        if not run.name.startswith("batch-"):
            continue
        i = next(i for i, (_, loss) in enumerate(run.history) if loss <= TARGET)
        step = run.history[i][0]
        before = run.history[i - 1][0] if i else 0
        batch = int(run.name.removeprefix("batch-"))
        rows.append({"batch_size": batch, "steps": step, "steps_uncertainty": step - before})
    return sorted(rows, key=lambda r: r["batch_size"])


def test_one_command_from_mlflow_runs_to_a_budget(
    live: LiveService, mlflow_server: str, tmp_path: Path
) -> None:
    tracker = MlflowClient(mlflow_server)
    runs = training_runs()
    experiment = f"pilots-{uuid.uuid4().hex[:6]}"
    ids = log_runs(tracker, experiment, runs + bad_runs())
    name = f"from-mlflow-{uuid.uuid4().hex[:6]}"
    # a measurements file gives the rest of the plan (here: a cheaper bootstrap)
    base = tmp_path / "plan.json"
    base.write_text(json.dumps({"measurements": {}, "targets": {"bootstrap": 100}}))
    args = ["plan", str(base), "--from-mlflow", experiment, "--tracking-uri", mlflow_server,
            "--target-loss", str(TARGET), "--wait", "--json", "--name", name]  # fmt: skip
    out = run_cli(args, live.client_env(), timeout=240)
    assert out.code == 0, out.stderr
    doc = json.loads(out.stdout)
    report, job = doc["runs"], doc["job"]

    sent = job["request"]["measurements"]
    assert sent["steps_to_target"] == expected_steps(runs)
    assert sent["steps_to_target_loss"] == TARGET
    finals = {int(r.name[5:]): r.history[-1][1] for r in runs if r.name.startswith("data-")}
    assert sent["loss_vs_data"] == [{"n_samples": d, "loss": finals[d]} for d in DATA_SIZES]
    assert job["request"]["targets"] == {"bootstrap": 100, "target_loss": TARGET}

    used = {e["run"] for e in report["used"]}
    assert used == {ids[r.name] for r in runs}
    skipped = {e["name"]: e["reasons"] for e in report["skipped"]}
    assert set(skipped) == {"no-params", "never"}
    assert "no batch-size param" in skipped["no-params"]["steps_to_target"]
    assert "no dataset-size param" in skipped["no-params"]["loss_vs_data"]
    assert "never reaches the target 0.6" in skipped["never"]["steps_to_target"]
    by_name = {e["name"]: e for e in report["used"]}
    assert by_name["batch-4"]["batch_size"] == 4  # per_device_train_batch_size 2 × world_size 2

    assert job["status"] == "succeeded"
    rec = job["result"]["recommendation"]
    budget = rec["budget"]
    assert budget["batch"]["source"] == "batch_sweep"
    assert budget["batch"]["critical"] == rec["batch_size"]["b_crit"]["value"]
    # the loop's schedule puts B_crit at B0 = 32; SGD noise moves the measured crossings
    assert B0 / 1.6 < budget["batch"]["critical"] < B0 * 1.6
    assert budget["data"]["source"] == "data_sweep"
    assert DATA_SIZES[0] < budget["data"]["recommended_examples"] < DATA_SIZES[-1]


def test_run_ids_and_nothing_usable(live: LiveService, mlflow_server: str) -> None:
    tracker = MlflowClient(mlflow_server)
    experiment = f"bad-{uuid.uuid4().hex[:6]}"
    ids = log_runs(tracker, experiment, bad_runs())
    picked = read_experiment_runs(experiment, run_ids=[ids["never"]], tracking_uri=mlflow_server)
    assert [r.run for r in picked] == [ids["never"]]
    assert picked[0].params["batch_size"] == "8" and picked[0].status == "FINISHED"
    other = log_runs(tracker, f"other-{uuid.uuid4().hex[:6]}", bad_runs()[:1])
    with pytest.raises(RunsInputError, match="belongs to experiment"):
        read_experiment_runs(experiment, run_ids=[other["no-params"]], tracking_uri=mlflow_server)

    name = f"nothing-{uuid.uuid4().hex[:6]}"
    args = ["plan", "--from-mlflow", experiment, "--tracking-uri", mlflow_server,
            "--target-loss", str(TARGET), "--name", name]  # fmt: skip
    out = run_cli(args, live.client_env(), timeout=120)
    assert out.code == 2, out.stdout + out.stderr
    assert "no usable run" in out.stderr and "nothing submitted" in out.stderr
    assert "skipped " in out.stderr and "never reaches the target 0.6" in out.stderr
    missing = run_cli(["plan", "--from-mlflow", "no-such-experiment", "--tracking-uri",
                       mlflow_server], live.client_env(), timeout=120)  # fmt: skip
    assert missing.code == 2 and "no MLflow experiment named 'no-such-experiment'" in missing.stderr
    with curvplan.Client(live.url, live.api_key) as api:
        assert api.list_jobs(name=name).items == []  # nothing was submitted
