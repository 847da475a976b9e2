"""Benchmark: Δ_k for N = 1,000,000 losses × 100 orderings, fit and 1,000-resample bootstrap.

Goal: under 2 s on the 2-core dev machine, peak memory under 2 GB.

Prints, side by side:
- the planner path (`loss_difference_curves` + `fit_power_law` with bootstrap), wall time and
  peak RSS;
- a naive reference: a Python loop over orderings, each computing the full Δ_k for every k by
  cumsum (single thread), a np.polyfit on log-spaced k, and a bootstrap that recomputes the
  resampled orderings' curves for every replicate. The loop over orderings is measured; the
  bootstrap recomputation (1,000 × 100 full curves) is extrapolated from the measured
  per-ordering cost and labelled as such.

Usage: python benchmarks/bench_planner.py [--n 1000000] [--orderings 100] [--bootstrap 1000]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curvplan_core.planner import Measurements, Targets, make_plan
from curvplan_core.planner.loss_curve import (
    data_influence_cov,
    data_influence_draws,
    data_scale_bootstrap,
    default_window,
    fit_power_law,
    loss_difference_curves,
)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def planner_path(losses: np.ndarray, orderings: int, bootstrap: int) -> tuple[float, float, float]:
    """Returns (wall seconds, wall seconds for the curves alone, CPU seconds over all threads)."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    curves = loss_difference_curves(losses, orderings=orderings, seed=0)
    t_curves = time.perf_counter() - t0
    window = default_window(losses.size)
    fit = fit_power_law(curves.abs_by_ordering, curves.grid, window, bootstrap=bootstrap, seed=0)
    # the data-sampling part of the intervals, as the planner adds it (sample_size_section)
    t_data = time.perf_counter()
    data_scale_bootstrap(losses, bootstrap=bootstrap, seed=0, stream=2)
    cov = data_influence_cov(losses, curves.grid, window, fit.weights, seed=0, stream=40)
    shift = data_influence_draws(cov, bootstrap=bootstrap, seed=0, stream=41)
    fit = fit_power_law(
        curves.abs_by_ordering,
        curves.grid,
        window,
        bootstrap=bootstrap,
        seed=0,
        data_shift=shift,
    )
    t_data = time.perf_counter() - t_data
    print(f"  data-sampling terms (grouped bootstrap + influence): {t_data:.3f} s")
    total = time.perf_counter() - t0
    cpu = time.process_time() - c0
    lo, hi = np.quantile(fit.alpha_boot, [0.025, 0.975])
    print(
        f"  fit: C = {fit.C:.5f}, alpha = {fit.alpha:.5f} [{lo:.5f}, {hi:.5f}], R² = {fit.r2:.5f}"
    )
    return total, t_curves, cpu


def naive_ordering(losses: np.ndarray, seed: int, r: int, k_eval: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, r)))
    y = rng.permutation(losses)
    running = np.cumsum(y) / np.arange(1, y.size + 1)
    delta = np.abs(np.diff(running))
    return delta[k_eval - 1]


def naive_path(losses: np.ndarray, orderings: int, bootstrap: int) -> tuple[float, float, float]:
    """Returns (measured seconds for the ordering loop + one fit, seconds per ordering,
    extrapolated seconds for the full naive bootstrap)."""
    n = losses.size
    k_min, k_max = default_window(n)
    k_eval = np.unique(np.geomspace(k_min, k_max, 200).astype(np.int64))
    c0 = time.process_time()
    t0 = time.perf_counter()
    rows = [naive_ordering(losses, 0, r, k_eval) for r in range(orderings)]
    t_loop = time.perf_counter() - t0
    print(f"  naive CPU time for the ordering loop: {time.process_time() - c0:.3f} s")
    mean = np.mean(rows, axis=0)
    t1 = time.perf_counter()
    slope, _ = np.polyfit(np.log(k_eval), np.log(mean), 1)
    t_fit = time.perf_counter() - t1
    per_ordering = t_loop / orderings
    # naive bootstrap: every replicate recomputes its resampled orderings' curves, then refits
    extrapolated = bootstrap * (orderings * per_ordering + t_fit)
    print(f"  naive fit: alpha = {-slope:.5f}")
    return t_loop + t_fit, per_ordering, extrapolated


def end_to_end(losses: np.ndarray, orderings: int, bootstrap: int) -> float:
    t0 = time.perf_counter()
    measurements = Measurements.model_validate({"per_sample_losses": losses.tolist()})
    targets = Targets(tolerances=[1e-3, 1e-5], orderings=orderings, bootstrap=bootstrap)
    make_plan(measurements, targets)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--orderings", type=int, default=100)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--skip-naive", action="store_true")
    args = parser.parse_args()

    losses = np.random.default_rng(42).exponential(size=args.n)
    rss_before = peak_rss_mib()
    print(f"N = {args.n:,} losses, R = {args.orderings} orderings, B = {args.bootstrap} bootstrap")
    print("planner (curvplan_core.planner.loss_curve):")
    total, t_curves, cpu = planner_path(losses, args.orderings, args.bootstrap)
    rss_after = peak_rss_mib()
    print(
        f"  time: {total:.3f} s (curves {t_curves:.3f} s, fit + bootstrap {total - t_curves:.3f} s)"
    )
    print(f"  CPU time over all threads: {cpu:.3f} s; load average now {os.getloadavg()[0]:.1f}")
    print(f"  peak RSS: {rss_after:.0f} MiB (process; {rss_before:.0f} MiB before the run)")
    print(
        f"  goal: < 2 s and < 2048 MiB -> {'met' if total < 2 and rss_after < 2048 else 'NOT met'}"
    )
    plan_time = end_to_end(losses, args.orderings, args.bootstrap)
    print(f"end to end (validate Measurements + make_plan, sample_size only): {plan_time:.3f} s")
    if args.skip_naive:
        return
    print("naive reference (Python loop over orderings, full Δ_k by cumsum, np.polyfit):")
    measured, per_ordering, extrapolated = naive_path(losses, args.orderings, args.bootstrap)
    print(
        f"  measured: {measured:.3f} s for {args.orderings} orderings + 1 fit "
        f"({per_ordering * 1e3:.1f} ms per ordering)"
    )
    print(f"  bootstrap recomputing curves per replicate: ~{extrapolated:.0f} s (extrapolated)")
    print(f"  peak RSS after naive: {peak_rss_mib():.0f} MiB")
    print(
        f"ratio naive/planner, without bootstrap: {measured / t_curves:.1f}x; "
        f"with the naive bootstrap: ~{(measured + extrapolated) / total:.0f}x (extrapolated)"
    )


if __name__ == "__main__":
    main()
