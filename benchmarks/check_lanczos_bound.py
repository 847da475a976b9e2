"""The Lanczos certificate on every block of the bundled example (``curvplan example``) against
its dense block Hessians: for each block, tolerance and start seed, is the true error of each
end within the reported residual (docs/numerics.md#lanczos)?

The dense oracle is H_BB built column by column in float64 (``dense_hessian``) and ``eigvalsh``;
the spectra are measured with float64 products and with float32 products (what an analysis
uses), the latter allowed the float32 rounding level 30·eps·‖H_B‖ on top of the residual.

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/check_lanczos_bound.py [--dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_lockstep import _load, write_examples

from curvplan_worker.curvature.dense import dense_hessian
from curvplan_worker.curvature.operator import CurvatureEngine
from curvplan_worker.curvature.spectra import block_spectrum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/curvplan-bench-examples")
    ap.add_argument("--tols", default="1e-2,1e-3,1e-4")
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.stdout.reconfigure(line_buffering=True)
    model = write_examples(Path(args.dir))["example"]
    tols = [float(t) for t in args.tols.split(",")]
    exact: dict[str, np.ndarray] = {}
    source, module, data, blocks = _load(model, torch.float64)
    with CurvatureEngine(module, source.objective, data.batches(None)) as eng:
        for name, members in blocks.items():
            h = dense_hessian(eng, members, members).double()
            exact[name] = np.linalg.eigvalsh((0.5 * (h + h.T)).numpy())
    checked = violations = 0
    worst = 0.0
    for dtype in (torch.float64, torch.float32):
        source, module, data, blocks = _load(model, dtype)
        eps = torch.finfo(dtype).eps
        with CurvatureEngine(module, source.objective, data.batches(None)) as eng:
            for name, members in blocks.items():
                ev = exact[name]
                norm = max(abs(ev[0]), abs(ev[-1]))
                allowance = (1e-11 if dtype == torch.float64 else 30 * eps) * norm
                cells = []
                for tol in tols:
                    for seed in range(args.seeds):
                        gen = torch.Generator().manual_seed(seed)
                        s = block_spectrum(eng, members, generator=gen, tol=tol)
                        for value, res, want in (
                            (s.lambda_max, s.residual_max, ev[-1]),
                            (s.lambda_min, s.residual_min, ev[0]),
                        ):
                            checked += 1
                            err = abs(value - want)
                            worst = max(worst, err / (res + allowance))
                            violations += err > res + allowance
                        cells.append(f"{s.n_products}{'' if s.converged else '!'}")
                print(
                    f"{str(dtype)[6:]:<8}{name:<22}{len(ev):>6}  products by tol×seed: "
                    + " ".join(cells)
                )
    print(
        f"{checked} ends checked, {violations} with the true error above the reported residual "
        f"(+ rounding allowance); worst error / bound {worst:.2f}"
    )


if __name__ == "__main__":
    main()
