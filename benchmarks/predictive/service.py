"""The service half: ask a scratch curvplan service the same questions, as a user would.

A real ``curvplan serve`` and two ``curvplan worker`` processes on a scratch database
(``bench_service.scratch_service``). Uploaded: the converged checkpoint, the intermediate
checkpoints, the training examples and the held-out sample. Submitted: a batch sweep and a
data sweep (``kind: sweep``, the same batch sizes / subset sizes as the ground truth), then
an analyze with the intermediate checkpoints alone and one with the sweeps as well. Every
answer is read as JSON, so fields other sessions add or rename show up as ``not_available``
instead of breaking the benchmark.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _result(api: Any, job_id: str, timeout: float) -> dict:
    done = api.wait(job_id, timeout=timeout)
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
    batch_sweep: dict,
    data_sweep: dict,
    optimizer: dict,
    analysis_options: dict,
    timeout: float = 3600.0,
    workers: int = 2,
) -> dict:
    """Run the sweeps and the two analyses; the raw JSON answers and the CPU they took."""
    from bench_service import scratch_service

    from curvplan import Client

    cpu0 = _cpu_children()
    wall0 = time.monotonic()
    out: dict[str, Any] = {}
    service = scratch_service(admin_url, "predictive", workers=workers, queues="cpu,gpu")
    with service as base, Client(base_url=base) as api:
        ids = {}
        for key in ("checkpoint", "train", "eval"):
            kind = "checkpoint" if key == "checkpoint" else "dataset"
            ids[key] = str(api.upload_artifact(files[key], kind).id)
        intermediates = [
            str(api.upload_artifact(p, "checkpoint").id) for p in files["intermediates"]
        ]
        common = {
            "kind": "sweep",
            "model": spec,
            "train_data": ids["train"],
            "eval_data": ids["eval"],
            "optimizer": optimizer,
        }
        started = {}
        for name, settings in (("batch_sweep", batch_sweep), ("data_sweep", data_sweep)):
            body = {**common, "name": f"predictive-{name}", "sweep": settings}
            started[name] = (str(api.submit_job(body).id), time.monotonic())
        for name, (job_id, t0) in started.items():
            out[name] = _result(api, job_id, timeout)
            out[name]["wall_s"] = time.monotonic() - t0
        sweeps = [
            out[n]["id"] for n in ("batch_sweep", "data_sweep") if out[n]["status"] == "succeeded"
        ]
        targets = {"target_loss": target_loss, "available_samples": available_samples}
        for name, with_sweeps in (("analyze", []), ("analyze_with_sweeps", sweeps)):
            t0 = time.monotonic()
            body = {
                "kind": "analyze",
                "name": f"predictive-{name}",
                "model": spec,
                "checkpoint": ids["checkpoint"],
                "dataset": ids["eval"],
                "intermediate_checkpoints": intermediates,
                "options": analysis_options,
                "targets": targets,
                "sweeps": with_sweeps,
            }
            job = api.submit_job(body)
            out[name] = _result(api, str(job.id), timeout)
            out[name]["wall_s"] = time.monotonic() - t0
    out["cpu_s"] = _cpu_children() - cpu0
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
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
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
