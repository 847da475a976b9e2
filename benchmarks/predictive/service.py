"""The service half: ask a scratch curvplan service the same questions, as a user would.

A real ``curvplan serve`` and two ``curvplan worker`` processes on a scratch database
(``bench_service.scratch_service``). Uploaded: the converged checkpoint, the intermediate
checkpoints, the training examples and the held-out sample. Submitted: a batch sweep and a
branch sweep from the intermediate checkpoints (``kind: sweep``, the ground truth's batch
sizes) and an analyze with the intermediate checkpoints alone. The data sweep is the one that
analysis prescribes: the command in its ``budget.data.next_step`` is run as printed (the
``curvplan sweep`` CLI, only ``--url`` and ``--json`` added), then an analyze with the sweeps;
while its ``budget.data`` is ``extrapolated`` or ``not_available`` with a next round, that
round's printed command is run too and the analysis repeated with every data sweep
(``--sweep OLD --sweep NEW``). The same, from the sweeps at hand, at each further target.
Every answer is read as JSON, so fields other sessions add or rename show up as
``not_available`` instead of breaking the benchmark.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


class CpuMeter:
    """CPU seconds of the service's processes (the API, the workers, their forkservers and
    the job processes those reap; not the benchmark's own multiprocessing children), polled
    each second: Σ user + system +
    reaped children's, the largest sum seen. The forkservers are never reaped by the workers,
    so ``getrusage(RUSAGE_CHILDREN)`` alone would miss the jobs' CPU."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> float:
        import psutil

        total = 0.0
        for top in psutil.Process(os.getpid()).children():
            try:
                if any("multiprocessing" in part for part in top.cmdline()):
                    continue  # the benchmark's own truth processes, counted by themselves
                procs = [top, *top.children(recursive=True)]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            for proc in procs:
                try:
                    t = proc.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                total += t.user + t.system + t.children_user + t.children_system
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def __enter__(self) -> CpuMeter:
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _result(api: Any, job_id: str, timeout: float) -> dict:
    try:
        done = api.wait(job_id, timeout=timeout)
    except Exception as exc:  # a timeout or a lost service is reported, not raised
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}", "id": str(job_id)}
    job = done.model_dump(mode="json")
    if job["status"] != "succeeded":
        return {"status": job["status"], "error": job.get("error"), "id": str(job_id)}
    return {"status": "succeeded", "id": str(job_id), "result": job["result"]}


def _data_budget(answer: dict) -> dict:
    """``budget.data`` of an analyze answer ({} when the job did not succeed)."""
    if answer.get("status") != "succeeded":
        return {}
    budget = (answer.get("result") or {}).get("recommendation") or {}
    return (budget.get("budget") or {}).get("data") or {}


def printed_command(command: str, base: str, files: dict[str, Any]) -> list[str]:
    """The argv of a ``next_step`` command as printed, run against ``base``: ``curvplan`` is
    this interpreter's console script, the reference placeholders (``model.json``,
    ``train.safetensors``, ``eval.safetensors``) name the benchmark's files, and only
    ``--url`` and ``--json`` are added (every flag the service printed is kept as it is)."""
    from bench_service import curvplan_command

    argv = shlex.split(command)
    if argv[:2] != ["curvplan", "sweep"]:
        raise ValueError(f"next_step is not a `curvplan sweep` command: {command!r}")
    names = {
        "model.json": str(files["spec"]),
        "train.safetensors": str(files["train"]),
        "eval.safetensors": str(files["eval"]),
    }
    return [*curvplan_command(), *(names.get(a, a) for a in argv[1:]), "--url", base, "--json"]


def run_printed(command: str, base: str, files: dict[str, Any], timeout: float) -> dict:
    """Run a printed ``curvplan sweep … --wait`` command; the job's answer as JSON (the CLI
    prints the finished job with ``--json``), with the command and its wall time."""
    argv = printed_command(command, base, files)
    t0 = time.monotonic()
    print(f"[service] running as printed: {command}", flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    record: dict[str, Any] = {"command": command, "wall_s": time.monotonic() - t0}
    try:
        job = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {
            **record,
            "status": "error",
            "error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}",
        }
    job = job.get("job", job)
    if job.get("status") != "succeeded":
        return {**record, "status": job.get("status"), "error": job.get("error"), "id": job["id"]}
    return {**record, "status": "succeeded", "id": str(job["id"]), "result": job["result"]}


def _round_record(target: float, data_ids: list[str], answer: dict) -> dict:
    data = _data_budget(answer)
    step = data.get("next_step") or {}
    return {
        "target_loss": target,
        "data_sweeps": list(data_ids),
        "status": answer.get("status"),
        "source": data.get("source"),
        "recommended_examples": data.get("recommended_examples"),
        "recommended_examples_ci": data.get("recommended_examples_ci"),
        "measured_sizes": data.get("measured_sizes"),
        "reason": data.get("reason"),
        "next_round_sizes": step.get("next_round_sizes"),
        "next_command": step.get("command"),
        "analyze_id": answer.get("id"),
    }


def ask_service(
    admin_url: str,
    files: dict[str, Any],
    *,
    spec: dict,
    target_loss: float,
    available_samples: int,
    batch_sweep: dict | None,
    follow_data_next_step: bool,
    optimizer: dict,
    analysis_options: dict,
    branch_sweep: dict | None = None,
    first_analyze: bool = True,
    more_targets: tuple[float, ...] = (),
    max_next_rounds: int = 2,
    timeout: float = 4 * 3600.0,
    workers: int = 2,
) -> dict:
    """Run the sweeps and the analyses; the raw JSON answers and the CPU they took.

    The batch and branch sweeps and the first analysis (intermediates only) are submitted
    together. With ``follow_data_next_step``, the first analysis's ``budget.data.next_step``
    command is then run as printed (:func:`run_printed`), and the analysis with the sweeps
    repeated while it prescribes a next round (at most ``max_next_rounds`` more commands,
    ``data_rounds`` records each step), at ``target_loss`` and then at each of
    ``more_targets`` (``analyze_at_targets``). A failure is recorded under its name and the
    rest still runs. A sweep given as None is not run; the branch sweep branches from the
    intermediate checkpoints; ``first_analyze=False`` skips the intermediates-only analysis
    (and the data sweep it would prescribe)."""
    from bench_service import scratch_service

    from curvplan import Client

    wall0 = time.monotonic()
    out: dict[str, Any] = {}
    service = scratch_service(admin_url, "predictive", workers=workers, queues="cpu,gpu")
    meter = CpuMeter()
    try:
        with meter, service as base, Client(base_url=base) as api:
            ids = {}
            for key in ("checkpoint", "train", "eval"):
                kind = "checkpoint" if key == "checkpoint" else "dataset"
                ids[key] = str(api.upload_artifact(files[key], kind).id)
            intermediates = [
                str(api.upload_artifact(p, "checkpoint").id) for p in files["intermediates"]
            ]

            def analyze(name: str, sweeps: list[str], target: float) -> str:
                body = {
                    "kind": "analyze",
                    "name": f"predictive-{name}",
                    "model": spec,
                    "checkpoint": ids["checkpoint"],
                    "dataset": ids["eval"],
                    "intermediate_checkpoints": intermediates,
                    "options": analysis_options,
                    "targets": {"target_loss": target, "available_samples": available_samples},
                    "sweeps": sweeps,
                }
                return str(api.submit_job(body).id)

            common = {
                "kind": "sweep",
                "model": spec,
                "train_data": ids["train"],
                "eval_data": ids["eval"],
                "optimizer": optimizer,
            }
            started = {}
            for name, settings in (("batch_sweep", batch_sweep), ("branch_sweep", branch_sweep)):
                if settings is None:
                    continue
                body = {**common, "name": f"predictive-{name}", "sweep": settings}
                if name == "branch_sweep":
                    body["checkpoints"] = intermediates
                started[name] = str(api.submit_job(body).id)
            t0 = time.monotonic()
            if first_analyze:
                out["analyze"] = _result(api, analyze("analyze", [], target_loss), timeout)
                out["analyze"]["wall_s_since_submit"] = time.monotonic() - t0
            step = _data_budget(out.get("analyze", {})).get("next_step")
            data_ids: list[str] = []
            if follow_data_next_step and step:
                out["data_sweep"] = run_printed(step["command"], base, files, timeout)
                if out["data_sweep"]["status"] == "succeeded":
                    data_ids.append(out["data_sweep"]["id"])
            elif follow_data_next_step:
                out["data_sweep"] = {"status": "not_run", "error": "no budget.data.next_step"}
            for name, job_id in started.items():
                out[name] = _result(api, job_id, timeout)
                out[name]["wall_s_since_submit"] = time.monotonic() - t0
            others = [
                out[n]["id"]
                for n in ("batch_sweep", "branch_sweep")
                if n in out and out[n]["status"] == "succeeded"
            ]
            rounds: list[dict] = []
            more_rounds: list[dict] = []
            finals: dict[str, dict] = {}
            for k, target in enumerate((target_loss, *more_targets)):
                while True:
                    t1 = time.monotonic()
                    name = "analyze_with_sweeps" if k == 0 else f"analyze_at_{target:g}"
                    answer = _result(api, analyze(name, others + data_ids, target), timeout)
                    answer["wall_s_since_submit"] = time.monotonic() - t1
                    record = _round_record(target, data_ids, answer)
                    rounds.append(record)
                    data = _data_budget(answer)
                    nxt = data.get("next_step") or {}
                    if (
                        not follow_data_next_step
                        or data.get("source") not in ("extrapolated", "not_available")
                        or not nxt.get("next_round_sizes")
                        or len(more_rounds) >= max_next_rounds
                    ):
                        break
                    swept = run_printed(nxt["command"], base, files, timeout)
                    swept["target_loss"] = target
                    more_rounds.append(swept)
                    if swept["status"] != "succeeded":
                        break
                    data_ids.append(swept["id"])
                finals[f"{target:g}"] = answer
            out["analyze_with_sweeps"] = finals[f"{target_loss:g}"]
            out["analyze_at_targets"] = finals
            out["data_rounds"] = rounds
            out["data_next_rounds"] = more_rounds
            meter.poll()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    for name in ("batch_sweep", "data_sweep", "branch_sweep", "analyze", "analyze_with_sweeps"):
        out.setdefault(name, {"status": "not_run", "error": out.get("error")})
    out["cpu_s"] = meter.peak
    out["wall_s"] = time.monotonic() - wall0
    return out


def write_files(
    directory: Path,
    *,
    checkpoint_model: Any,
    intermediates: dict[int, dict],
    train: tuple[Any, Any],
    evaluation: tuple[Any, Any],
    spec: dict,
) -> dict[str, Any]:
    """The safetensors files a user would upload (engine-contract names) and the spec."""
    import torch
    from safetensors.torch import save_file

    from curvplan_worker.curvature.checkpoint import save_checkpoint

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    save_checkpoint(checkpoint_model, directory / "checkpoint.safetensors")
    paths = []
    for step, state in sorted(intermediates.items()):
        path = directory / f"step_{step}.safetensors"
        # the step in the safetensors metadata, as a training loop would write it: the
        # service names the checkpoint by it and the noise trend places it on the step axis
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            str(path),
            metadata={"step": str(step)},
        )
        paths.append(path)
    for name, (x, y) in (("train", train), ("eval", evaluation)):
        save_file(
            {"inputs": torch.as_tensor(x).contiguous(), "targets": torch.as_tensor(y).contiguous()},
            str(directory / f"{name}.safetensors"),
        )
    return {
        "checkpoint": directory / "checkpoint.safetensors",
        "intermediates": paths,
        "train": directory / "train.safetensors",
        "eval": directory / "eval.safetensors",
        "spec": directory / "spec.json",
    }
