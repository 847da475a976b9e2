"""Where the products of a block spectrum go: the Lanczos iteration traced step by step on the
HF GPT-2 blocks of ``bench_hf_curvature.py`` (1.33 M parameters, float32, one thread).

For every block it runs ``block_spectrum`` at ``--tol`` with a ``trace`` and compares each
step's extreme Ritz values with a reference (the same solver at ``--reference-tol``): per step
the relative eigenvalue error of each end, |θ − λ| / max(|λ|, floor·‖H‖), and the relative
recurrence residual β|s_k| / scale, which is what the stop certifies (docs/numerics.md#lanczos).
The summary says, per block, the step at which both ends' eigenvalues were first within the
tolerance, the step at which both residuals first were, and the products the run made (steps
plus the explicit checks).

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/bench_lanczos_trace.py [--steps]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hf_curvature import head_to_head_blocks, problem

from curvplan_worker.curvature.objective import CausalLMObjective
from curvplan_worker.curvature.operator import CurvatureEngine
from curvplan_worker.curvature.spectra import block_spectrum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--reference-tol", type=float, default=2e-6)
    ap.add_argument("--floor", type=float, default=1e-3)
    ap.add_argument("--max-blocks", type=int, default=6)
    ap.add_argument("--train-steps", type=int, default=100)
    ap.add_argument("--steps", action="store_true", help="print every step, not only the summary")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.stdout.reconfigure(line_buffering=True)
    model, x, y = problem(args.train_steps)
    blocks = dict(list(head_to_head_blocks(model.module).items())[: args.max_blocks])
    tol, floor = args.tol, args.floor
    print(f"# tol {tol:g}, reference tol {args.reference_tol:g}, floor {floor:g}, float32")
    print(
        f"{'block':<18}{'n':>8}{'products':>9}{'steps':>6}{'checks':>7}"
        f"{'eig<=tol':>9}{'res<=tol':>9}  (step where both ends first meet it)"
    )
    totals = [0, 0, 0, 0]
    with CurvatureEngine(model.module, CausalLMObjective(), [(x, y)]) as eng:
        for name, members in blocks.items():
            ref = block_spectrum(
                eng, members, generator=torch.Generator().manual_seed(1), tol=args.reference_tol
            )
            norm = max(abs(ref.lambda_max), abs(ref.lambda_min))
            scale_hi = max(abs(ref.lambda_max), floor * norm)
            scale_lo = max(abs(ref.lambda_min), floor * norm)
            records: list[dict] = []
            t0 = time.process_time()
            spec = block_spectrum(
                eng,
                members,
                generator=torch.Generator().manual_seed(0),
                tol=tol,
                floor=floor,
                trace=records.append,
            )
            cpu = time.process_time() - t0
            eig_at = res_at = None
            checks = 0
            for r in records:
                if r.get("check"):
                    checks += 1
                    if args.steps:
                        print(
                            f"    check at step {r['step']}: relative residuals "
                            f"{r['residual_max'] / r['scale_max']:.1e} / "
                            f"{r['residual_min'] / r['scale_min']:.1e}, "
                            f"{r['products']} products, converged {r['converged']}"
                        )
                    continue
                err = max(
                    abs(r["theta_max"] - ref.lambda_max) / scale_hi,
                    abs(r["theta_min"] - ref.lambda_min) / scale_lo,
                )
                res = max(r["rho_max"] / scale_hi, r["rho_min"] / scale_lo)
                if eig_at is None and err <= tol:
                    eig_at = r["step"]
                if res_at is None and res <= tol:
                    res_at = r["step"]
                if args.steps:
                    print(
                        f"    step {r['step']:3d} basis {r['basis']:3d}: eigenvalue error "
                        f"{err:.1e}, recurrence residual {res:.1e}"
                    )
            n = eng.layout(tuple(members)).numel
            print(
                f"{name:<18}{n:>8}{spec.n_products:>9}{spec.iterations:>6}{checks:>7}"
                f"{eig_at or -1:>9}{res_at or -1:>9}  ({cpu:.1f} CPU s, "
                f"{spec.restarts} restarts, basis {spec.basis_vectors})"
            )
            totals[0] += spec.n_products
            totals[1] += spec.iterations
            totals[2] += eig_at or spec.iterations
            totals[3] += res_at or spec.iterations
    print(
        f"total: {totals[0]} products, {totals[1]} steps; both ends' eigenvalues within tol "
        f"after {totals[2]} steps, both recurrence residuals within tol after {totals[3]}: "
        f"the residual stop costs {totals[3] / totals[2]:.2f}x the steps the eigenvalues need"
    )


if __name__ == "__main__":
    main()
