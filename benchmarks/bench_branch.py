"""The branch sweep (critical batch size by branched training) beside the README's batch sweep.

Both on the example model (`curvplan example`: a 19k-parameter LM, 32 tokens per example),
submitted to a scratch `curvplan serve` + `curvplan worker` (PostgreSQL: ``--admin-url``),
one after the other on the same worker(s):

* **batch sweep** — the README's: batches 8…128 from a seeded initialisation, each trained
  to ``--target-loss`` (cap ``--max-steps``), fit S = S_min(1 + B_crit/B);
* **branch sweep** — from the example's ``step_<n>`` checkpoints, each of the same batches
  trains ``--window-tokens`` tokens; CBS per checkpoint (Merrill et al. 2025).

Printed side by side: training runs, optimizer steps, training tokens processed (steps × B ×
tokens per example, every run, including censored and failed ones), wall time submit →
success, the sum of the runs' own seconds, and the ratios batch / branch; then each
checkpoint's CBS beside the batch sweep's B_crit.

    python benchmarks/bench_branch.py [--workers 1] [--out benchmarks/results/branch-cpu.txt]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_service import curvplan_command, scratch_service

BATCHES = [8, 16, 32, 64, 128]
CHECKPOINT_STEPS = (25, 50, 100, 200)


def _run(api: Any, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    start = time.monotonic()
    job = api.submit_job(body)
    done = api.wait(job.id, timeout=7200)
    wall = time.monotonic() - start
    if done.status != "succeeded":
        raise RuntimeError(f"{body['sweep']['type']} sweep {done.status}: {done.error}")
    return done.result.model_dump(mode="json")["sweep"], wall


def _cost(sweep: dict[str, Any], tokens_per_example: float) -> dict[str, float]:
    runs = [p["result"] for p in sweep["points"] if p["result"]]
    steps = sum(r["eval_steps"][-1] for r in runs)
    examples = sum(r["eval_steps"][-1] * r["batch_size"] for r in runs)
    return {
        "runs": len(sweep["points"]),
        "steps": steps,
        "tokens": examples * tokens_per_example,
        "run_s": sum(r["seconds"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--example", type=Path, default=Path("/tmp/curvplan-bench-example"))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--target-loss", type=float, default=1.6)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--window-tokens", type=int, default=32 * 1024)
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument(
        "--checkpoints",
        default=",".join(map(str, CHECKPOINT_STEPS)),
        help="step_<n> to branch from",
    )
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not (args.example / "train.safetensors").exists():
        subprocess.run([*curvplan_command(), "example", "--out", str(args.example)], check=True)
    spec = json.loads((args.example / "spec.json").read_text())
    steps = [int(s) for s in args.checkpoints.split(",")]
    tpe = float(spec["task"]["seq_len"])
    from curvplan import Client

    service = scratch_service(args.admin_url, "branch", workers=args.workers, queues="cpu,gpu")
    with service as base, Client(base_url=base) as api:
        train = api.upload_artifact(args.example / "train.safetensors", "dataset")
        evaluation = api.upload_artifact(args.example / "data.safetensors", "dataset")
        checkpoints = [
            str(api.upload_artifact(args.example / f"step_{s}.safetensors", "checkpoint").id)
            for s in steps
        ]
        time.sleep(args.settle)  # let the workers' forkservers import torch first
        common = {
            "kind": "sweep",
            "model": spec,
            "train_data": str(train.id),
            "eval_data": str(evaluation.id),
            "optimizer": {"name": "adamw", "lr": 3e-3, "base_batch_size": 32},
        }
        batch, batch_wall = _run(
            api,
            {
                **common,
                "sweep": {
                    "type": "batch",
                    "target_loss": args.target_loss,
                    "batch_sizes": BATCHES,
                    "max_steps": args.max_steps,
                },
            },
        )
        branch, branch_wall = _run(
            api,
            {
                **common,
                "checkpoints": checkpoints,
                "sweep": {
                    "type": "branch",
                    "batch_sizes": BATCHES,
                    "window_tokens": args.window_tokens,
                    "tolerance": args.tolerance,
                },
            },
        )
    costs = {"batch sweep": _cost(batch, tpe), "branch sweep": _cost(branch, tpe)}
    costs["batch sweep"]["wall_s"] = batch_wall
    costs["branch sweep"]["wall_s"] = branch_wall
    lines = [
        f"example model {spec['d_model']}d × {spec['n_layers']} layers, {tpe:g} tokens/example; "
        f"{args.workers} worker(s); batches {BATCHES}",
        f"batch sweep: from a seeded init to eval loss {args.target_loss} (cap {args.max_steps} "
        "steps)",
        f"branch sweep: from step_{{{','.join(map(str, steps))}}}, window "
        f"{branch['branch']['window_tokens']:,.0f} tokens, ε = {args.tolerance} (end of window)",
        "",
        f"{'':14} {'runs':>5} {'steps':>7} {'train tokens':>13} {'wall s':>8} {'Σ run s':>8}",
    ]
    for name, c in costs.items():
        lines.append(
            f"{name:14} {c['runs']:>5} {c['steps']:>7} {c['tokens']:>13,.0f} "
            f"{c['wall_s']:>8.1f} {c['run_s']:>8.1f}"
        )
    b, r = costs["batch sweep"], costs["branch sweep"]
    lines.append(
        f"{'batch/branch':14} {b['runs'] / r['runs']:>5.2f} {b['steps'] / r['steps']:>7.2f} "
        f"{b['tokens'] / r['tokens']:>13.2f} {b['wall_s'] / r['wall_s']:>8.2f} "
        f"{b['run_s'] / r['run_s']:>8.2f}"
    )
    fit = (batch.get("batch") or {}).get("fit") or {}
    lines += ["", f"batch sweep B_crit = {fit.get('value', float('nan')):.4g} (CI {fit.get('ci')})"]
    for c in branch["branch"]["checkpoints"]:
        lines.append(
            f"branch CBS at step {c['step']:>4} (loss {c['loss']:.3f}): {c['critical_batch']} "
            f"({c['status']}; next {c['next_batch']})"
        )
    stages = ", ".join(
        f"{s['from_step']}: {s['batch_size']}" for s in branch["branch"]["warmup_schedule"]
    )
    lines.append(f"warm-up schedule (step: batch): {stages}")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
