"""Cancel latency of the curvature engine: checks inside the loops vs. at progress reports only.

One analysis of a single block (exact Hutch++ trace: one Hessian product per parameter, so the
block lasts long) runs in-process; cancellation is requested ``--after`` seconds into the block.

* ``in-loop``: ``analyze(..., should_cancel=flag)`` as the worker calls it — the Lanczos, trace,
  per-sample and gradient-noise loops check the flag
  (``workers/curvplan_worker/curvature/cancel.py``);
* ``at-reports``: the same run where only the progress reports check the flag (how the engine
  behaved before the loop checks): the block runs to its end before the run stops.

Prints, side by side, the seconds from the request to the run stopping and their ratio. In a
worker, add up to one heartbeat period (``CURVPLAN_HEARTBEAT_SECONDS``) before the flag is set.

``--service``: the figure a user sees. A scratch service (``curvplan serve`` + one ``curvplan
worker`` with its default cancel grace, one torch thread) runs two analyses and each is
cancelled ``--after`` seconds into its block spectra, timed from ``POST …/cancel`` to the job
reading ``cancelled`` (long poll):

* ``small products``: the model above (milliseconds per product): the engine's loop checks stop
  it, the worker's kill is not needed;
* ``large product``: a model of 1.6 M parameters on 32 × 128 tokens (seconds per product), so
  the request lands inside one product, which no loop check interrupts: the worker's kill
  after ``--cancel-grace-seconds`` (1 s) ends it.

    python benchmarks/bench_cancel.py [--after 2] [--params layers.0.q] [--threads 1]
    python benchmarks/bench_cancel.py --service [--admin-url postgresql://…]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from curvplan.types.options import MachineSettings
from curvplan_worker.curvature import analyze as engine
from curvplan_worker.curvature.data import Dataset
from curvplan_worker.curvature.model import build_model

SPEC = {
    "d_model": 32,
    "n_heads": 2,
    "d_ff": 64,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 16, "seq_len": 8},
}


def run(block: str, after: float, in_loop: bool) -> float:
    """Seconds from the request to the run stopping."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 16, (16, 9), generator=gen)
    data = Dataset(tokens[:, :-1], tokens[:, 1:])
    model = build_model(SPEC, seed=1)
    flag = threading.Event()
    asked: dict[str, float] = {}
    started = threading.Event()

    def progress(event) -> None:
        if event.stage == "blocks":
            started.set()
        if not in_loop and flag.is_set():  # the report-only behaviour
            raise engine.Cancelled(event.stage)

    def arm() -> None:
        started.wait()
        time.sleep(after)
        asked["t"] = time.perf_counter()
        flag.set()

    threading.Thread(target=arm, daemon=True).start()
    options = {
        "precision": "float64",
        "seed": 3,
        "dense": "off",
        "tolerance": 1e-6,
        "max_iter": 80,
        "trace_probes": 10_000,
        "off_diagonal": False,
        "per_sample": False,
        "gradient_noise": False,
        "bounds": False,
        "blocks": [block],
    }
    try:
        engine.analyze(
            SPEC,
            None,
            None,
            options,
            progress=progress,
            should_cancel=flag.is_set if in_loop else None,
            model=model,
            data=data,
            machine=MachineSettings(self_test=False),
        )
    except engine.Cancelled:
        return time.perf_counter() - asked["t"]
    raise RuntimeError("the block ended before the cancel request; use a smaller --after")


LARGE_SPEC = {
    "d_model": 256,
    "n_heads": 4,
    "d_ff": 1024,
    "n_layers": 2,
    "task": {"type": "causal_lm", "vocab_size": 256, "seq_len": 128},
}


def product_seconds(spec: dict, data: Dataset) -> float:
    """Seconds of one Hessian-vector product over every parameter (measured here, once)."""
    from curvplan_worker.curvature.objective import objective_for
    from curvplan_worker.curvature.operator import CurvatureEngine

    model = build_model(spec, seed=1)
    with CurvatureEngine(model, objective_for(spec), [(data.inputs, data.targets)]) as engine:
        names = list(engine.names)
        v = torch.randn(engine.layout(names).numel, generator=torch.Generator().manual_seed(0))
        engine.hvp(names, names, v)  # builds the graph cache
        start = time.perf_counter()
        engine.hvp(names, names, v)
        return time.perf_counter() - start


def service_latencies(admin_url: str, after: float) -> list[tuple[str, float, float, str]]:
    """(case, seconds per product, request → cancelled, final status) through a service."""
    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_service import scratch_service

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import save_dataset

    out = Path(tempfile.mkdtemp(prefix="bench-cancel-files-"))
    gen = torch.Generator().manual_seed(0)
    cases = []
    for name, spec, n, vocab in (
        ("small products", SPEC, 16, 16),
        ("large product", LARGE_SPEC, 32, 256),
    ):
        save_checkpoint(build_model(spec, seed=1), out / f"{n}.ckpt.safetensors")
        seq = spec["task"]["seq_len"]
        tokens = torch.randint(0, vocab, (n, seq + 1), generator=gen)
        data = Dataset(tokens[:, :-1], tokens[:, 1:])
        save_dataset(data, out / f"{n}.data.safetensors")
        cases.append((name, spec, n, product_seconds(spec, data)))
    env = {
        "CURVPLAN_WORKER_THREADS": "1",
        "CURVPLAN_WORKER_SELF_TEST": "false",
        "CURVPLAN_WORKER_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "CURVPLAN_MAX_ARTIFACT_BYTES": str(256 * 2**20),
    }
    rows = []
    service = scratch_service(admin_url, "cancel", workers=1, queues="gpu,cpu", env=env)
    with service as base, httpx.Client(base_url=base, timeout=60) as client:
        for name, spec, n, seconds in cases:
            ids = {}
            for part, kind in (("ckpt", "checkpoint"), ("data", "dataset")):
                with (out / f"{n}.{part}.safetensors").open("rb") as fh:
                    response = client.post(
                        "/v1/artifacts",
                        files={"file": (fh.name, fh, "application/octet-stream")},
                        data={"kind": kind},
                    )
                response.raise_for_status()
                ids[part] = response.json()["id"]
            body = {
                "kind": "analyze",
                "model": spec,
                "checkpoint": ids["ckpt"],
                "dataset": ids["data"],
                "options": {
                    "fan_out": False,
                    "blocks": ["layers.0.ffn_in"],
                    "trace_probes": 2000,
                    "dense": "off",
                },
            }
            response = client.post("/v1/jobs", json=body)
            response.raise_for_status()
            job_id = response.json()["id"]
            job = _wait_for_blocks(client, job_id)
            time.sleep(after)
            asked = time.perf_counter()
            client.post(f"/v1/jobs/{job_id}/cancel").raise_for_status()
            while job["status"] not in ("cancelled", "failed", "succeeded"):
                job = client.get(f"/v1/jobs/{job_id}", params={"wait": 5}).json()
            rows.append((name, seconds, time.perf_counter() - asked, job["status"]))
    return rows


def _wait_for_blocks(client: Any, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if ((job.get("progress") or {}).get("stage") or "").startswith("block spectra"):
            return job
        if job["status"] not in ("queued", "running"):
            raise RuntimeError(f"job {job['status']} before its block spectra: {job['error']}")
        time.sleep(0.05)
    raise RuntimeError("the analysis never reached its block spectra")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--after", type=float, default=2.0, help="seconds into the block")
    parser.add_argument("--params", default="layers.0.q", help="the block (default blocks)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--service", action="store_true", help="through a service (see above)")
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.service:
        rows = service_latencies(args.admin_url, args.after)
        print(f"through a service, cancel {args.after:g} s into the block spectra")
        print(f"{'case':<18}{'one product (s)':>17}{'request → cancelled (s)':>26}  status")
        for name, seconds, took, status in rows:
            print(f"{name:<18}{seconds:>17.3f}{took:>26.3f}  {status}")
        return
    in_loop = run(args.params, args.after, in_loop=True)
    at_reports = run(args.params, args.after, in_loop=False)
    print(f"block {args.params}, cancel {args.after:g} s into it, {args.threads} thread(s)")
    print(f"{'checks':<12}{'request → stopped (s)':>24}")
    print(f"{'in-loop':<12}{in_loop:>24.3f}")
    print(f"{'at-reports':<12}{at_reports:>24.3f}")
    print(f"ratio at-reports / in-loop: {at_reports / max(in_loop, 1e-9):.0f}x")


if __name__ == "__main__":
    main()
