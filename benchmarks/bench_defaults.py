"""Planning-grade defaults against a strict run: does the budget move? And what does it cost?

The ``curvplan example`` model (and, with ``--hf``, the tiny Hugging Face GPT-2 of ``curvplan
example --arch gpt2``) is analysed twice through a scratch service (``curvplan serve`` and one
``curvplan worker``, one torch thread), with the same checkpoint, data and intermediate
checkpoint(s):

* ``default``: no options (relative tolerance 1e-3 in float32, 15 trace probes);
* ``strict``: ``tolerance=1e-6, precision=float64`` (and the previous default of 30 trace
  probes), the strict mode one option away.

Prints every number of ``recommendation.budget`` and the curvature summary's λ_max side by side
with their relative difference (goal: < 1 % on every budget number), and the wall time and
Hessian products of each run (the defaults' speed-up). Needs PostgreSQL (``--admin-url``).

    OMP_NUM_THREADS=1 python benchmarks/bench_defaults.py [--intermediates 1] [--hf]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_service import curvplan_command, scratch_service

STRICT = {"tolerance": 1e-6, "precision": "float64", "trace_probes": 30}


def leaves(value: Any, prefix: str = "") -> dict[str, float]:
    """Every finite number in a JSON value, by its dotted path."""
    out: dict[str, float] = {}
    if isinstance(value, bool) or value is None:
        return out
    if isinstance(value, int | float):
        if math.isfinite(value):
            out[prefix] = float(value)
        return out
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(leaves(item, f"{prefix}.{key}" if prefix else str(key)))
    if isinstance(value, list):
        for i, item in enumerate(value):
            out.update(leaves(item, f"{prefix}[{i}]"))
    return out


def upload(client: Any, path: Path, kind: str) -> str:
    with path.open("rb") as fh:
        response = client.post(
            "/v1/artifacts",
            files={"file": (path.name, fh, "application/octet-stream")},
            data={"kind": kind},
        )
    response.raise_for_status()
    return str(response.json()["id"])


def wait_done(client: Any, job_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}", params={"wait": 10}).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
    raise RuntimeError(f"job {job_id} not done after {timeout} s")


def run_pair(base: str, body: dict[str, Any], timeout: float) -> dict[str, dict[str, Any]]:
    import httpx

    out = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        for name, options in (("default", {}), ("strict", STRICT)):
            started = time.monotonic()
            response = client.post("/v1/jobs", json={**body, "options": options})
            response.raise_for_status()
            done = wait_done(client, response.json()["id"], timeout)
            if done["status"] != "succeeded":
                raise RuntimeError(f"{name}: {done['status']}: {done['error']}")
            measured = done["result"]["measurements"]
            out[name] = {
                "wall_s": time.monotonic() - started,
                "products": sum(b["n_products"] for b in measured["blocks"]),
                "budget": done["result"]["recommendation"]["budget"],
                "lambda_max": {b["name"]: b["lambda_max"] for b in measured["blocks"]},
                "estimate": measured.get("cost_estimate"),
            }
    return out


def compare(title: str, runs: dict[str, dict[str, Any]]) -> float:
    """Print the side-by-side table; the largest relative difference of a budget number."""
    default, strict = leaves(runs["default"]["budget"]), leaves(runs["strict"]["budget"])
    print(f"\n## {title}")
    d, s = runs["default"], runs["strict"]
    print(f"{'run':<10}{'wall s':>10}{'block products':>16}")
    for name in ("default", "strict"):
        print(f"{name:<10}{runs[name]['wall_s']:>10.1f}{runs[name]['products']:>16}")
    print(
        f"speed-up of the defaults: {s['wall_s'] / d['wall_s']:.2f}x wall, "
        f"{s['products'] / max(d['products'], 1):.2f}x products"
    )
    worst = 0.0
    print(f"{'budget number':<58}{'default':>13}{'strict':>13}{'rel. diff':>11}")
    for key in sorted(set(default) | set(strict)):
        a, b = default.get(key), strict.get(key)
        if a is None or b is None:
            print(f"{key:<58}{a!s:>13}{b!s:>13}{'missing':>11}")
            worst = math.inf
            continue
        rel = abs(a - b) / max(abs(b), 1e-300) if a != b else 0.0
        if key.endswith("_products"):  # provenance: the work a number took, not the number
            print(f"{key:<58}{a:>13.6g}{b:>13.6g}{rel:>11.2e}  (work done, not compared)")
            continue
        worst = max(worst, rel)
        print(f"{key:<58}{a:>13.6g}{b:>13.6g}{rel:>11.2e}")
    lam = max(
        abs(d["lambda_max"][k] - s["lambda_max"][k]) / max(abs(s["lambda_max"][k]), 1e-300)
        for k in s["lambda_max"]
    )
    print(f"largest relative difference of a block λ_max: {lam:.2e}")
    print(f"largest relative difference of a budget number: {worst:.2e} (goal < 1e-2)")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--intermediates", type=int, default=1, help="last N of the example's")
    parser.add_argument("--hf", action="store_true", help="also the tiny Hugging Face GPT-2")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-defaults-"))
    cmd = curvplan_command()
    subprocess.run([*cmd, "example", "--out", str(tmp / "example")], check=True)
    if args.hf:
        subprocess.run([*cmd, "example", "--arch", "gpt2", "--out", str(tmp / "gpt2")], check=True)
    env = {
        "CURVPLAN_WORKER_THREADS": "1",
        "CURVPLAN_WORKER_SELF_TEST": "false",
        "CURVPLAN_WORKER_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
        "CURVPLAN_MAX_ARTIFACT_BYTES": str(512 * 2**20),
    }
    import httpx

    worst = []
    with scratch_service(args.admin_url, "defaults", workers=1, queues="gpu,cpu", env=env) as base:
        with httpx.Client(base_url=base, timeout=60) as client:
            ex = tmp / "example"
            summary = json.loads((ex / "example.json").read_text())
            steps = summary["intermediate_checkpoints"][-args.intermediates :]
            body = {
                "kind": "analyze",
                "model": json.loads((ex / "spec.json").read_text()),
                "checkpoint": upload(client, ex / "checkpoint.safetensors", "checkpoint"),
                "dataset": upload(client, ex / "data.safetensors", "dataset"),
                "intermediate_checkpoints": [
                    upload(client, ex / name, "checkpoint") for name in steps
                ],
                "targets": {"tolerances": [0.05]},
            }
        runs = run_pair(base, body, args.timeout)
        worst.append(compare(f"example ({len(steps)} intermediate checkpoint(s))", runs))
        if args.hf:
            with httpx.Client(base_url=base, timeout=60) as client:
                hf = tmp / "gpt2"
                body = {
                    "kind": "analyze",
                    "model": {
                        "source": "huggingface",
                        "config": json.loads((hf / "config.json").read_text()),
                    },
                    "checkpoint": upload(client, hf / "model.safetensors", "checkpoint"),
                    "dataset": upload(client, hf / "data.safetensors", "dataset"),
                    "targets": {"tolerances": [0.05]},
                }
            worst.append(compare("tiny Hugging Face GPT-2", run_pair(base, body, args.timeout)))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"every budget number within 1 %: {all(w < 1e-2 for w in worst)}")


if __name__ == "__main__":
    main()
