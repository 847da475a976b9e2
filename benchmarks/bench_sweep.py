"""The example batch sweep run by 1 and by 2 workers: wall time and speed-up, side by side.

Starts ``curvplan serve`` and W ``curvplan worker --queues cpu,gpu`` processes on a scratch
database, writes ``curvplan example`` (if ``--example`` has none), submits the README's batch
sweep, and times submit → the parent's success. Each point trains on one thread (a tiny model),
so 2 workers can run 2 points at once on 2 free cores. Needs PostgreSQL: ``--admin-url``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``).

    python benchmarks/bench_sweep.py --workers 1,2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_service import curvplan_command, scratch_service


def run_once(admin_url: str, example: Path, workers: int, args: argparse.Namespace) -> dict:
    from curvplan import Client

    with scratch_service(admin_url, "sweep", workers=workers, queues="cpu,gpu") as base:
        with Client(base_url=base) as api:
            spec = json.loads((example / "spec.json").read_text())
            train = api.upload_artifact(example / "train.safetensors", "dataset")
            evaluation = api.upload_artifact(example / "data.safetensors", "dataset")
            time.sleep(args.settle)  # let the workers' forkservers import torch first
            body = {
                "kind": "sweep",
                "model": spec,
                "train_data": str(train.id),
                "eval_data": str(evaluation.id),
                "optimizer": {"name": "adamw", "lr": 3e-3, "base_batch_size": 32},
                "sweep": {
                    "type": "batch",
                    "target_loss": args.target_loss,
                    "batch_sizes": [8, 16, 32, 64, 128],
                    "max_steps": 400,
                },
            }
            start = time.monotonic()
            job = api.submit_job(body)
            done = api.wait(job.id, timeout=3600)
            wall = time.monotonic() - start
            if done.status != "succeeded":
                raise RuntimeError(f"sweep {done.status}: {done.error}")
            # the client types job results by the kinds it models; a sweep's is read as JSON
            sweep = done.result.model_dump(mode="json")["sweep"]
            fit = sweep["batch"]["fit"]
            point_seconds = sum(p["result"]["seconds"] for p in sweep["points"] if p["result"])
        return {
            "workers": workers,
            "wall_s": wall,
            "sum_point_s": point_seconds,
            "b_crit": fit.get("value"),
            "b_crit_ci": fit.get("ci"),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--example", type=Path, default=Path("/tmp/curvplan-bench-example"))
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--target-loss", type=float, default=1.6)
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args()
    if not (args.example / "train.safetensors").exists():
        subprocess.run([*curvplan_command(), "example", "--out", str(args.example)], check=True)
    rows = [run_once(args.admin_url, args.example, int(w), args) for w in args.workers.split(",")]
    base = rows[0]["wall_s"]
    print(f"{'workers':>8} {'wall s':>8} {'speed-up':>9} {'Σ point s':>10} {'B_crit':>8}")
    for row in rows:
        print(
            f"{row['workers']:>8} {row['wall_s']:>8.1f} {base / row['wall_s']:>9.2f} "
            f"{row['sum_point_s']:>10.1f} {row['b_crit']:>8.3g}"
        )


if __name__ == "__main__":
    main()
