"""Cost of the whole-model λ_max (one Lanczos over all parameters) beside the block spectra it
complements, on the quick-start example (``curvplan example --out DIR``): products, seconds and
the λ_max each finds, side by side.

The whole-model λ_max is what the budget's gradient-descent sharpness threshold 2/λ_max needs;
the largest block λ_max is only a lower bound on it (interlacing). Same tolerance, iteration cap
and precision as an analysis with default options; one torch thread. A timing is never an
assertion here.

    curvplan example --out /tmp/ex
    python benchmarks/bench_full_model_lambda.py /tmp/ex [--json results/x.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from curvplan.types.options import AnalysisOptions
from curvplan_worker.curvature.analyze import block_key, derived_generator
from curvplan_worker.curvature.blocks import default_blocks
from curvplan_worker.curvature.full_model import FULL_MODEL_KEY, full_model_lambda_max
from curvplan_worker.curvature.hvp import CurvatureEngine
from curvplan_worker.curvature.sources import load_source, parse_model
from curvplan_worker.curvature.spectra import block_spectrum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("example", type=Path, help="a `curvplan example --out` directory")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    spec = json.loads((args.example / "spec.json").read_text())
    opts = AnalysisOptions()
    torch.set_num_threads(1)
    source = load_source(
        parse_model(spec),
        str(args.example / "checkpoint.safetensors"),
        str(args.example / "data.safetensors"),
        dtype=torch.float32,
        seed=0,
    )
    blocks = default_blocks(source.module)
    batches = source.data.batches(source.micro_batch(opts.eval_batch_size))
    with CurvatureEngine(source.module, source.objective, batches) as engine:
        engine.gradient()
        started = time.perf_counter()
        block_products, block_top = 0, 0.0
        for name, members in blocks.items():
            spectrum = block_spectrum(
                engine,
                members,
                generator=derived_generator(opts.seed, block_key(name)),
                tol=opts.tolerance,
                max_iter=opts.max_iter,
                floor=opts.residual_floor,
            )
            block_products += spectrum.n_products
            block_top = max(block_top, spectrum.lambda_max)
        block_seconds = time.perf_counter() - started
        started = time.perf_counter()
        full = full_model_lambda_max(
            engine,
            generator=derived_generator(opts.seed, FULL_MODEL_KEY),
            tol=opts.tolerance,
            max_iter=opts.max_iter,
            floor=opts.residual_floor,
        )
        full_seconds = time.perf_counter() - started
    if not full["available"]:
        raise SystemExit(f"whole model: {full['reason']}")
    out = {
        "n_parameters": full["n_params"],
        "blocks": len(blocks),
        "block_spectra": {"products": block_products, "seconds": round(block_seconds, 2)},
        "full_model": {
            "products": full["n_products"],
            "seconds": round(full_seconds, 2),
            "converged": full["converged"],
        },
        "largest_block_lambda_max": block_top,
        "full_model_lambda_max": full["lambda_max"],
        "tolerance": opts.tolerance,
        "precision": "float32",
    }
    print(f"{'':28}{'products':>10}{'seconds':>10}{'λ_max':>12}")
    print(f"{'block spectra (' + str(len(blocks)) + ' blocks)':28}{block_products:>10}"
          f"{block_seconds:>10.1f}{block_top:>12.4g}")  # fmt: skip
    print(f"{'whole model (top end only)':28}{full['n_products']:>10}{full_seconds:>10.1f}"
          f"{full['lambda_max']:>12.4g}")  # fmt: skip
    print(f"ratio full/blocks: products {full['n_products'] / block_products:.3f}, "
          f"λ_max {full['lambda_max'] / block_top:.3f}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
