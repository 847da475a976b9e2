"""Consistency of the budget on the example LM, from finished jobs of a running service.

1. The noise-scale batch (an analyze job's budget, trend over the step_<n> checkpoints at the
   target loss) against the batch sweep's B_crit interval.
2. L(D) fitted on the data sweep's smaller subsets predicts the held-out loss at the largest
   D within its interval (the fit's parameter covariance, t-distributed draws).

    python benchmarks/consistency_example.py --analyze <job> --batch-sweep <job> --data-sweep <job>
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def main() -> None:
    from curvplan import Client
    from curvplan_core.planner.scaling import fit_loss_vs_data

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analyze", required=True)
    parser.add_argument("--batch-sweep", required=True)
    parser.add_argument("--data-sweep", required=True)
    parser.add_argument("--confidence", type=float, default=0.95)
    args = parser.parse_args()
    with Client() as api:
        analyze = api.get_job(args.analyze).result or {}
        batch = api.get_job(args.batch_sweep).result or {}
        data = api.get_job(args.data_sweep).result or {}
    trend = analyze["recommendation"]["budget"]["batch"]
    fit = batch["sweep"]["batch"]["fit"]
    print("1. noise-scale batch vs the batch sweep's B_crit")
    print(
        f"   analyze budget: source {trend['source']}, critical {trend['critical']}, "
        f"interval {trend['critical_ci']}, target loss {trend['target_loss']}"
    )
    print(
        f"   batch sweep: B_crit {fit.get('value')}, interval {fit.get('ci')}, "
        f"target loss {batch['sweep']['target_loss']}"
    )
    at = batch["sweep"].get("b_simple_at_target") or {}
    print(
        f"   two-batch B_simple at the sweep's target (training gradients): {at.get('value')} "
        f"{at.get('ci')}"
    )
    if trend["critical"] is not None and fit.get("ci"):
        lo, hi = fit["ci"]
        inside = lo <= trend["critical"] <= hi
        print(f"   noise-scale batch inside the B_crit interval: {inside}")

    table = data["sweep"]["data"]["loss_vs_data"]
    d = np.array([row["n_samples"] for row in table])
    loss = np.array([row["loss"] for row in table])
    order = np.argsort(d)
    d, loss = d[order], loss[order]
    small = fit_loss_vs_data(d[:-1], loss[:-1], args.confidence)
    rng = np.random.default_rng(0)
    theta = np.array([small.E, math.log(small.A), small.beta])
    draws = (
        theta
        + rng.standard_t(max(small.dof, 1), size=(4000, 3))
        @ np.linalg.cholesky(small.cov + 1e-300 * np.eye(3)).T
    )
    pred = draws[:, 0] + np.exp(draws[:, 1] - draws[:, 2] * math.log(d[-1]))
    lo, hi = np.quantile(pred, [(1 - args.confidence) / 2, (1 + args.confidence) / 2])
    center = small.E + small.A * d[-1] ** -small.beta
    print("2. L(D) fitted without the largest subset, predicting it")
    print(
        f"   fit on D = {d[:-1].astype(int).tolist()}: E {small.E:.4g}, A {small.A:.4g}, "
        f"β {small.beta:.3g}"
    )
    print(
        f"   predicted loss at D = {int(d[-1])}: {center:.4f} [{lo:.4f}, {hi:.4f}]; "
        f"measured {loss[-1]:.4f}; inside: {lo <= loss[-1] <= hi}"
    )


if __name__ == "__main__":
    main()
