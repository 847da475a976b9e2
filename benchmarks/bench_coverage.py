"""Coverage of every interval the planner and the engine report, over ≥ 1000 seeded replicates.

Each row draws data from a population with a known truth, computes the reported interval at a
nominal 0.95 and counts how often it contains the truth; old behaviour is printed beside the new
one where it changed (docs/numbers.md says what each number means). Run once:

    .venv/bin/python benchmarks/bench_coverage.py [--reps 1000]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
import torch
from scipy import stats

from curvplan_core.planner.critical_batch import (
    fit_steps_to_target,
    linear_cross_check,
)
from curvplan_core.planner.loss_accuracy import (
    cluster_robust_variance,
    k_loss_accuracy,
    loss_variance,
)
from curvplan_core.planner.scaling import data_for_target_interval, fit_loss_vs_data
from curvplan_worker.curvature.noise_stream import (
    GroupedGradientSums,
    selection_bias,
    stream_estimates,
)
from curvplan_worker.curvature.trace import hutchpp_trace

CONF = 0.95


def _inside(ci: tuple[float, float] | None, truth: float) -> bool:
    """Whether the interval holds the truth (no interval: a miss)."""
    return ci is not None and ci[0] <= truth <= ci[1]


def _row(name: str, new: float, old: float | None = None, extra: str = "") -> None:
    old_text = "" if old is None else f"   (before: {old:.3f})"
    print(f"  {name:<58} {new:.3f}{old_text} {extra}")


def loss_accuracy(reps: int, rng: np.random.Generator) -> None:
    tol = 0.05
    truth = math.ceil(k_loss_accuracy(2.0, tol, CONF))
    hits = 0
    for _ in range(reps):
        var = loss_variance(rng.gamma(2.0, 1.0, size=1000), CONF)
        lo = math.ceil(k_loss_accuracy(var.ci[0], tol, CONF))
        hi = math.ceil(k_loss_accuracy(var.ci[1], tol, CONF))
        hits += lo <= truth <= hi
    _row("loss-accuracy n = z²σ²/ε² (Gamma(2) losses, N = 1000)", hits / reps)
    k = math.ceil(k_loss_accuracy(1.0, 0.01, CONF))
    k_star = 80  # the landscape-stabilisation k*(0.01) for σ = 1
    err = np.abs(rng.normal(0, 1, size=(4000, k_star)).mean(axis=1))
    print(
        f"  at k*(ε=0.01) = {k_star}: E|L_k − μ| = {err.mean():.3f} = {err.mean() / 0.01:.1f} ε; "
        f"loss accuracy ε needs n = {k} ({k / k_star:.0f}× k*)"
    )


def _linear_regression_gradients(rng: np.random.Generator, n: int, r: np.ndarray) -> np.ndarray:
    """g_i = 2x_i(x_iᵀr − ε_i), x ~ N(0, I), ε ~ N(0, σ²): per-example gradients of the squared
    error at w = w₀ + r (the correlated, heavy-tailed case)."""
    x = rng.normal(size=(n, r.size))
    return 2 * x * (x @ r - 0.7 * rng.normal(size=n))[:, None]


def noise_ratio(reps: int, rng: np.random.Generator) -> None:
    dim, n = 6, 64
    scales = np.array([3.0, 1.0, 0.5, 0.5, 0.3, 0.2])
    r = np.array([0.5, -0.3, 0.2, 0.1])
    cases = {
        "Gaussian gradients, |G|² ≫ SE": (
            lambda: rng.normal(size=(n, dim)) * scales + np.array([2.0, 0.5, 0, 0, 0, 0]),
            float((scales**2).sum() / 4.25),
        ),
        "Gaussian gradients, low signal": (
            lambda: rng.normal(size=(n, dim)) * scales + np.array([0.9, 0.2, 0, 0, 0, 0]),
            float((scales**2).sum() / 0.85),
        ),
        "linear-regression gradients (D = 4, n = 64)": (
            lambda: _linear_regression_gradients(rng, n, r),
            float((4 * (r @ r + 0.49) * r.size + 4 * r @ r) / (4 * r @ r)),
        ),
    }
    crit = stats.t.ppf(CONF, n - 1)
    for label, (draw, truth) in cases.items():
        hits = ind = total = defined = 0
        ratios = []
        for _ in range(reps):
            g = draw()
            acc = GroupedGradientSums(g.shape[1], 64)
            acc.add(torch.tensor(g))
            est = stream_estimates(acc.gram(), *acc.active()[1:])
            if est.grad_sq_norm - crit * est.grad_sq_norm_se > 0:
                defined += 1
                ratios.append(est.trace_sigma / est.grad_sq_norm / truth)
            if est.log_b_simple_se is None:
                continue
            total += 1
            t = stats.t.ppf((1 + CONF) / 2, est.groups - 1)
            c = math.log(est.trace_sigma / est.grad_sq_norm) - math.log(truth)
            hits += abs(c) <= t * est.log_b_simple_se
            se_ind = math.hypot(
                est.trace_sigma_se / est.trace_sigma, est.grad_sq_norm_se / est.grad_sq_norm
            )
            ind += abs(c) <= t * se_ind
        _row(
            f"B_simple CI, log-ratio jackknife ({label})",
            hits / max(total, 1),
            ind / max(total, 1),
            f"[independent errors]; P(defined) = {defined / reps:.2f}, "
            f"median est/truth | defined = {np.median(ratios) if ratios else float('nan'):.2f}",
        )
    scales = np.array([3.0, 1.0, 0.5, 0.5, 0.3, 0.2])
    # selection-bias bootstrap at the measured statistics vs the sampling distribution
    mu = np.array([0.9, 0.2, 0, 0, 0, 0])
    truth = float((scales**2).sum() / (mu @ mu))
    actual, boot_p, boot_r = [], [], []
    crit = stats.t.ppf(CONF, n - 1)
    for r in range(reps):
        acc = GroupedGradientSums(dim, 64)
        acc.add(torch.tensor(rng.normal(size=(n, dim)) * scales + mu))
        w, (_, n_b, q_b) = acc.gram(), acc.active()
        est = stream_estimates(w, n_b, q_b)
        if est.grad_sq_norm - crit * est.grad_sq_norm_se > 0:
            actual.append(est.trace_sigma / est.grad_sq_norm / truth)
        if r < 200:
            bias, _ = selection_bias(w, n_b, q_b, confidence=CONF, seed=r, draws=1000)
            if bias is not None:
                boot_p.append(bias.p_defined)
                if bias.median_ratio is not None:
                    boot_r.append(bias.median_ratio)
    print(
        f"  selection bias (low signal): actual P(defined) = {len(actual) / reps:.3f}, "
        f"bootstrap median {np.median(boot_p):.3f}; actual median est/truth = "
        f"{np.median(actual):.3f}, bootstrap median {np.median(boot_r):.3f}"
    )


def steps_table(
    rng: np.random.Generator, b: np.ndarray, mode: str, s_min: float = 1000.0, b_crit: float = 500.0
) -> np.ndarray:
    """A steps-to-target table from S = S_min(1 + B_crit/B) with additive noise on S (5 % of
    the smallest S: the evaluation interval that times the target) or multiplicative (10 %)."""
    model = s_min * (1 + b_crit / b)
    if mode == "additive":
        return np.abs(model + rng.normal(0, 0.05 * model.min(), b.size))
    return model * np.exp(rng.normal(0, 0.1, b.size))


def critical_batch(reps: int, rng: np.random.Generator, case: str = "") -> None:
    """B_crit, S_min and E_min intervals at 5–7 batch sizes: the profile-likelihood interval
    with its bootstrap threshold (the default) beside the previous default, the HC3 sandwich
    of the variance-function fit with t_(n−3), which refuses tables whose B_crit runs to the
    fit's edge (a refusal counts as a miss; an open end covers when the truth lies inside)."""
    s_min, b_crit = 1000.0, 500.0
    ladders = {
        "5 B 8..128": 2.0 ** np.arange(3, 8),
        "6 B 4..4096": 2.0 ** np.arange(2, 13, 2),
        "7 B 4..256": 2.0 ** np.arange(2, 9),
    }
    keys = ("B_crit", "S_min", "E_min")
    truths = {"B_crit": b_crit, "S_min": s_min, "E_min": s_min * b_crit}
    methods = ("profile", "variance_function")
    for mode in ("additive", "multiplicative"):
        for label, b in ladders.items():
            if case not in f"{mode}, {label}":
                continue
            hits = {m: dict.fromkeys(keys, 0) for m in methods}
            failed = dict.fromkeys(methods, 0)
            open_ends = unbounded = 0
            seconds = 0.0
            for i in range(reps):
                s = steps_table(rng, b, mode, s_min, b_crit)
                for method, count in hits.items():
                    start = time.perf_counter()
                    try:
                        fit = fit_steps_to_target(b, s, CONF, method=method, seed=i)  # type: ignore[arg-type]
                    except ValueError:  # B_crit at the edge of the range: no interval, a miss
                        failed[method] += 1
                        continue
                    if method == "profile":
                        seconds += time.perf_counter() - start
                        unbounded += fit.unbounded
                        open_ends += fit.b_crit_ci is not None and math.isinf(fit.b_crit_ci[1])
                    for key in keys:
                        ci = {"B_crit": fit.b_crit_ci, "S_min": fit.s_min_ci, "E_min": fit.e_min_ci}
                        count[key] += _inside(ci[key], truths[key])
            for key in keys:
                _row(
                    f"{key} CI, profile likelihood + bootstrap threshold ({mode}, {label})",
                    hits["profile"][key] / reps,
                    hits["variance_function"][key] / reps,
                    f"[GLS + HC3 sandwich, t_(n-3); refused (misses): "
                    f"{failed['variance_function']}]",
                )
            print(
                f"    B_crit upper end open (∞): {open_ends} of {reps}; fitted B_crit at the "
                f"edge (planner: not_computed, interval in the reason): {unbounded}; "
                f"profile fit {1000 * seconds / reps:.0f} ms per table"
            )
    if case:
        return
    b = 2.0 ** np.arange(5, 10)
    model = s_min * (1 + 100.0 / b)
    old = checked = 0
    for _ in range(reps):
        s = np.abs(model + 0.1 * model.mean() * rng.normal(size=b.size))
        fit = fit_steps_to_target(b, s, CONF)
        cross = linear_cross_check(b, s)
        if cross is None:
            continue
        checked += 1
        old += abs(cross.b_crit - fit.b_crit) > 0.2 * fit.b_crit
    _row(
        "linear cross-check false alarms (exact model, 10 % noise, 5 B)",
        0.0,
        old / checked,
        "[old > 20 % rule; now informational only]",
    )


def loss_vs_data(reps: int, rng: np.random.Generator, case: str = "") -> None:
    d = np.geomspace(1e3, 1e7, 8)
    e, a, beta = 1.5, 50.0, 0.35
    target = 1.6
    truth_d = (a / (target - e)) ** (1 / beta)
    for mode in ("multiplicative", "additive"):
        if case not in mode:
            continue
        hits = {"E": 0, "A": 0, "beta": 0, "D(target)": 0}
        old = {"E": 0, "A": 0, "beta": 0}
        zero_ends = 0
        for _ in range(reps):
            clean = e + a * d**-beta
            if mode == "multiplicative":
                y = clean * np.exp(rng.normal(0, 0.02, d.size))
            else:
                y = clean + rng.normal(0, 0.02 * clean.min(), d.size)
            for tally, method in ((hits, "variance_function"), (old, "hc3")):
                fit = fit_loss_vs_data(d, y, CONF, method=method)  # type: ignore[arg-type]
                tally["E"] += _inside(fit.E_ci, e)
                tally["A"] += _inside(fit.A_ci, a)
                tally["beta"] += _inside(fit.beta_ci, beta)
                if method == "variance_function":
                    ci = data_for_target_interval(fit, target, CONF)
                    if ci is not None:
                        lo, hi = ci
                        zero_ends += lo is not None and lo <= 0
                        hits["D(target)"] += (lo or 0.0) <= truth_d <= (hi or math.inf)
        for key, count in hits.items():
            _row(
                f"L(D) {key} CI ({mode} noise, 8 sizes)",
                count / reps,
                old[key] / reps if key in old else None,
                "[unweighted, HC3 sandwich]" if key in old else "[profile likelihood in log D]",
            )
        print(f"    D(target) intervals with a lower end ≤ 0: {zero_ends} of {reps}")


def _grouped_losses(
    rng: np.random.Generator, n_groups: int, per_group: int, between: float, within: float
) -> np.ndarray:
    """Per-example losses of windows cut from documents: a document effect (sd ``between``)
    shared by its windows plus window noise (sd ``within``), mean 2.0; shape (groups, per)."""
    effect = rng.normal(0.0, between, size=(n_groups, 1))
    return 2.0 + effect + rng.normal(0.0, within, size=(n_groups, per_group))


def loss_accuracy_guarantee(reps: int, rng: np.random.Generator) -> None:
    """The guarantee itself: an evaluation set of the stated n = z²σ̂²/ε² examples (σ̂² from a
    pilot of 1000) measures the mean loss within ±ε with probability ≥ 0.95. Independent
    draws (i.i.d. variance), and windows drawn from the same documents (16 per document):
    there the cluster-robust σ²_eff of ``cluster_robust_variance`` (whole documents drawn), and
    the i.i.d. one beside it, which the grouped case shows to be unsafe."""
    tol = 0.02
    for label, between, within, per in (
        ("independent draws", 0.0, 1.0, 1),
        ("16 windows per document", 0.5, 0.8, 16),
    ):
        hits = {"cluster-robust": 0, "i.i.d.": 0}
        sizes: dict[str, list[int]] = {k: [] for k in hits}
        for _ in range(reps):
            pilot = _grouped_losses(rng, 1000 // per, per, between, within).reshape(-1)
            groups = np.repeat(np.arange(pilot.size // per), per)
            variances = {"i.i.d.": loss_variance(pilot, CONF).variance}
            if per > 1:
                variances["cluster-robust"] = cluster_robust_variance(
                    pilot, groups, CONF
                ).effective_variance
            for name, variance in variances.items():
                n = math.ceil(k_loss_accuracy(variance, tol, CONF))
                sizes[name].append(n)
                docs = math.ceil(n / per)
                sample = _grouped_losses(rng, docs, per, between, within).reshape(-1)[:n]
                hits[name] += abs(float(sample.mean()) - 2.0) <= tol
        for name in ("cluster-robust", "i.i.d.") if per > 1 else ("i.i.d.",):
            _row(
                f"loss within ±{tol} with the stated n ({label}; {name} variance)",
                hits[name] / reps,
                extra=f"median n = {int(np.median(sizes[name]))}",
            )


def hutchpp(reps: int) -> None:
    gen = torch.Generator().manual_seed(9)
    q, _ = torch.linalg.qr(torch.randn(60, 60, generator=gen, dtype=torch.float64))
    hits = z_hits = 0
    for _ in range(reps):
        eig = 1.0 + torch.rand(60, generator=gen, dtype=torch.float64)
        mat = q @ torch.diag(eig) @ q.T
        est = hutchpp_trace(lambda v, m=mat: m @ v, 60, n_products=30, generator=gen)
        lo, hi = est.interval(CONF)
        truth = float(eig.sum())
        hits += lo <= truth <= hi
        z_hits += abs(est.value - truth) <= 1.96 * est.stderr
    _row("Hutch++ trace CI, t on m/3 − 1 dof (30 products)", hits / reps, z_hits / reps, "[z]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument(
        "--only",
        nargs="*",
        choices=[
            "loss_accuracy",
            "guarantee",
            "noise",
            "critical_batch",
            "loss_vs_data",
            "hutchpp",
        ],
        help="run only these sections",
    )
    parser.add_argument("--seed", type=int, default=2026, help="of the replicates' generator")
    parser.add_argument(
        "--case",
        default="",
        help="critical_batch / loss_vs_data: only the cases whose label holds this text "
        "(e.g. 'additive, 7 B'), to spread one section over processes",
    )
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    print(f"coverage at nominal {CONF} over {args.reps} replicates (truth known)")
    sections: dict[str, Callable[[], None]] = {
        "loss_accuracy": lambda: loss_accuracy(args.reps, rng),
        "guarantee": lambda: loss_accuracy_guarantee(args.reps, rng),
        "noise": lambda: noise_ratio(args.reps, rng),
        "critical_batch": lambda: critical_batch(args.reps, rng, args.case),
        "loss_vs_data": lambda: loss_vs_data(args.reps, rng, args.case),
        "hutchpp": lambda: hutchpp(args.reps),
    }
    for name in args.only or list(sections):
        section_start = time.perf_counter()
        print(f"[{name}]")
        sections[name]()
        print(f"  ({time.perf_counter() - section_start:.0f} s)", flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
