"""Block fan-out of one analysis over 1 and over 2 workers: model loads and wall time, side by side.

Two models, each one ``analyze`` job measuring λ_max, λ_min and the trace of every default
block, fanned out (``fan_out: true``) into ``--groups`` ``analyze_blocks`` children (the same
split for every worker count), run by W ``curvplan worker`` processes of one torch thread each
(``CURVPLAN_WORKER_THREADS=1``) against a scratch database:

* ``reference``: the reference GPT of ``bench_curvature.py`` (2 pre-LN layers, d_model 64,
  ~115k parameters, briefly trained; evaluation batch 64 × 32 tokens);
* ``gpt2``: the tiny Hugging Face GPT-2 of ``curvplan example --arch gpt2`` (2 layers, n_embd
  32, ~30k parameters; 64 × 32 tokens).

Times submit → the parent's success, and counts the model loads: every attempt of the parent
and of its children builds the model and reads the checkpoint once (a fan-out attempt that
plans the blocks in the worker loads it too), so loads = the attempts of the parent plus its
children's. Checks that every run gives the same block numbers (per-block seeds). Needs
PostgreSQL: ``--admin-url`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``). A
timing is never an assertion here; on a loaded machine two workers cannot reach 2×.

    python benchmarks/bench_fanout.py [--models reference,gpt2] [--workers 1,2] [--groups 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_service import scratch_service


def write_reference(out: Path, train_steps: int) -> dict[str, Any]:
    """The reference GPT's checkpoint and evaluation batch as files; returns the model."""
    from bench_curvature import REFERENCE_SPEC, reference_problem

    from curvplan_worker.curvature.checkpoint import save_checkpoint
    from curvplan_worker.curvature.data import Dataset, save_dataset

    out.mkdir(parents=True, exist_ok=True)
    model, _, x, y = reference_problem(train_steps)
    save_checkpoint(model, out / "checkpoint.safetensors")
    save_dataset(Dataset(x, y), out / "data.safetensors")
    return REFERENCE_SPEC


def write_gpt2(out: Path) -> dict[str, Any]:
    """The tiny Hugging Face GPT-2 example (``save_pretrained`` + its data); returns the model."""
    from curvplan_worker.curvature.hf_example import write_hf_example

    write_hf_example(out, "gpt2", n_eval=64)  # as recorded before
    (out / "model.safetensors").rename(out / "checkpoint.safetensors")
    config = json.loads((out / "config.json").read_text())
    return {"source": "huggingface", "config": config}


def wait_done(client: Any, job_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}", params={"wait": 10}).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
    raise RuntimeError(f"job {job_id} not done after {timeout} s")


def run_once(model: dict, files: Path, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    env = {
        "CURVPLAN_WORKER_THREADS": "1",
        "CURVPLAN_WORKER_SELF_TEST": "false",
        "CURVPLAN_WORKER_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
    }
    with scratch_service(args.admin_url, "fanout", workers=workers, queues="gpu", env=env) as base:
        with httpx.Client(base_url=base, timeout=30) as client:
            ids = {}
            for stem, kind in (("checkpoint", "checkpoint"), ("data", "dataset")):
                with (files / f"{stem}.safetensors").open("rb") as fh:
                    response = client.post(
                        "/v1/artifacts",
                        files={"file": (fh.name, fh, "application/octet-stream")},
                        data={"kind": kind},
                    )
                response.raise_for_status()
                ids[stem] = response.json()["id"]
            time.sleep(args.settle)  # let the workers' forkservers import torch first
            body = {
                "kind": "analyze",
                "model": model,
                "checkpoint": ids["checkpoint"],
                "dataset": ids["data"],
                "options": {
                    "fan_out": True,
                    "fan_out_groups": args.groups,
                    "tolerance": args.tol,
                    "max_iter": args.max_iter,
                    "trace_probes": args.trace_probes,
                    "dense": "off",
                    "per_sample": False,
                    "gradient_noise": False,
                    "bounds": False,
                },
            }
            start = time.monotonic()
            response = client.post("/v1/jobs", json=body)
            response.raise_for_status()
            job_id = response.json()["id"]
            done = wait_done(client, job_id, timeout=7200)
            wall = time.monotonic() - start
            children = client.get(f"/v1/jobs/{job_id}").json().get("children") or []
            child_attempts = [client.get(f"/v1/jobs/{c['id']}").json()["attempt"] for c in children]
        if done["status"] != "succeeded":
            raise RuntimeError(f"analysis {done['status']}: {done['error']}")
        measured = done["result"]["measurements"]
        stages = [mark["stage"] for mark in done["progress"]["stages"]]
        return {
            "workers": workers,
            "wall_s": wall,
            "children": measured["fan_out"]["children"],
            "parent_attempts": done["attempt"],
            "loads": done["attempt"] + sum(child_attempts),
            "parent_first_stage": stages[0] if stages else None,
            "blocks": [(b["name"], b["lambda_max"], b["lambda_min"]) for b in measured["blocks"]],
            "products": sum(b["n_products"] for b in measured["blocks"]),
        }


def report(name: str, rows: list[dict[str, Any]], groups: int) -> None:
    same = all(row["blocks"] == rows[0]["blocks"] for row in rows)
    print(
        f"== {name}: blocks {len(rows[0]['blocks'])}, products {rows[0]['products']}, "
        f"groups {groups}"
    )
    print("children (estimated cost → seconds), first run:")
    for child in rows[0]["children"]:
        cost = child.get("estimated_cost")
        print(
            f"  {len(child['blocks']):>3} blocks  est. cost {cost:>10.3g}"
            f"  {child['elapsed_s']:>7.1f} s"
        )
    base = rows[0]["wall_s"]
    print(
        f"{'workers':>8} {'wall s':>8} {'speed-up':>9} {'Σ child s':>10} {'loads':>6}"
        f" {'parent attempts':>16}  parent's first stage"
    )
    for row in rows:
        child_s = sum(c["elapsed_s"] or 0.0 for c in row["children"])
        print(
            f"{row['workers']:>8} {row['wall_s']:>8.1f} {base / row['wall_s']:>9.2f}"
            f" {child_s:>10.1f} {row['loads']:>6} {row['parent_attempts']:>16}"
            f"  {row['parent_first_stage']}"
        )
    print(f"identical block numbers across runs: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--models", default="reference,gpt2")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--trace-probes", type=int, default=30)
    parser.add_argument("--settle", type=float, default=8.0)
    args = parser.parse_args()
    results = {}
    for name in args.models.split(","):
        files = Path(tempfile.mkdtemp(prefix=f"bench-fanout-{name}-"))
        if name == "reference":
            model = write_reference(files, args.train_steps)
        else:
            model = write_gpt2(files)
        results[name] = [run_once(model, files, int(w), args) for w in args.workers.split(",")]
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, rows in results.items():
        report(name, rows, args.groups)


if __name__ == "__main__":
    main()
