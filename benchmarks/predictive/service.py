"""The service half: ask a scratch curvplan service the same questions, as a user would.

A real ``curvplan serve`` and two ``curvplan worker`` processes on a scratch database
(``bench_service.scratch_service``). Uploaded: the converged checkpoint, the intermediate
checkpoints, the training examples and the held-out sample. Submitted: a batch sweep, a
data sweep and a branch sweep from the intermediate checkpoints (``kind: sweep``, the same
batch sizes / subset sizes as the ground truth), then
an analyze with the intermediate checkpoints alone and one with the sweeps as well. Every
answer is read as JSON, so fields other sessions add or rename show up as ``not_available``
instead of breaking the benchmark.
"""

from __future__ import annotations

import os
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


def ask_service(
    admin_url: str,
    files: dict[str, Any],
    *,
    spec: dict,
    target_loss: float,
    available_samples: int,
    batch_sweep: dict | None,
    data_sweep: dict | None,
    optimizer: dict,
    analysis_options: dict,
    branch_sweep: dict | None = None,
    first_analyze: bool = True,
    timeout: float = 3600.0,
    workers: int = 2,
) -> dict:
    """Run the sweeps and the two analyses; the raw JSON answers and the CPU they took.

    The sweeps and the first analysis (intermediates only) are submitted together; the
    second analysis (intermediates + the sweeps that succeeded) after them. A failure is
    recorded under its name and the rest still runs. A sweep given as None is not run; the
    branch sweep branches from the intermediate checkpoints (``checkpoints``);
    ``first_analyze=False`` skips the intermediates-only analysis."""
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
            targets = {"target_loss": target_loss, "available_samples": available_samples}

            def analyze(name: str, sweeps: list[str]) -> str:
                body = {
                    "kind": "analyze",
                    "name": f"predictive-{name}",
                    "model": spec,
                    "checkpoint": ids["checkpoint"],
                    "dataset": ids["eval"],
                    "intermediate_checkpoints": intermediates,
                    "options": analysis_options,
                    "targets": targets,
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
            for name, settings in (
                ("batch_sweep", batch_sweep),
                ("data_sweep", data_sweep),
                ("branch_sweep", branch_sweep),
            ):
                if settings is None:
                    continue
                body = {**common, "name": f"predictive-{name}", "sweep": settings}
                if name == "branch_sweep":
                    body["checkpoints"] = intermediates
                started[name] = str(api.submit_job(body).id)
            if first_analyze:
                started["analyze"] = analyze("analyze", [])
            t0 = time.monotonic()
            for name, job_id in started.items():
                out[name] = _result(api, job_id, timeout)
                out[name]["wall_s_since_submit"] = time.monotonic() - t0
            sweeps = [
                out[n]["id"]
                for n in ("batch_sweep", "data_sweep", "branch_sweep")
                if n in out and out[n]["status"] == "succeeded"
            ]
            t0 = time.monotonic()
            out["analyze_with_sweeps"] = _result(
                api, analyze("analyze_with_sweeps", sweeps), timeout
            )
            out["analyze_with_sweeps"]["wall_s_since_submit"] = time.monotonic() - t0
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
    """The safetensors files a user would upload (engine-contract names)."""
    import json

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
    }
