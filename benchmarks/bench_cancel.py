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

    python benchmarks/bench_cancel.py [--after 2] [--params layers.0.q] [--threads 1]
"""

from __future__ import annotations

import argparse
import threading
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--after", type=float, default=2.0, help="seconds into the block")
    parser.add_argument("--params", default="layers.0.q", help="the block (default blocks)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    in_loop = run(args.params, args.after, in_loop=True)
    at_reports = run(args.params, args.after, in_loop=False)
    print(f"block {args.params}, cancel {args.after:g} s into it, {args.threads} thread(s)")
    print(f"{'checks':<12}{'request → stopped (s)':>24}")
    print(f"{'in-loop':<12}{in_loop:>24.3f}")
    print(f"{'at-reports':<12}{at_reports:>24.3f}")
    print(f"ratio at-reports / in-loop: {at_reports / max(in_loop, 1e-9):.0f}x")


if __name__ == "__main__":
    main()
