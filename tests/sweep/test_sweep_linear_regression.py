"""Known answer: linear regression (the reference spec with no layers is exactly a linear map)
trained with SGD by the sweep's own training function, where G, H and the per-example
covariance Σ are closed-form at every step (the population is the training set, sampled
uniformly):

    r_i = Θx̃_i − y_i,  g_i = (2/k)·r_i x̃_iᵀ,  G = mean_i g_i,  tr Σ = mean_i |g_i|² − |G|²,
    H = (2/k)·I_k ⊗ C with C = mean_i x̃_i x̃_iᵀ,
    B_simple = tr Σ/|G|²,  B_noise = tr(HΣ)/GᵀHG  (McCandlish et al. 2018, eq. 2.8–2.9).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from curvplan.types.spec import parse_spec  # noqa: E402
from curvplan.types.sweep import OptimizerSpec, PointSettings  # noqa: E402
from curvplan_core.planner.critical_batch import fit_steps_to_target  # noqa: E402
from curvplan_core.planner.gradient_noise import (  # noqa: E402
    ratio_of_means_bootstrap,
    two_batch_estimates,
)
from curvplan_worker.curvature.data import Dataset  # noqa: E402
from curvplan_worker.curvature.model import build_model  # noqa: E402
from curvplan_worker.curvature.objective import objective_for  # noqa: E402
from curvplan_worker.sweep.train import train_point  # noqa: E402

D, K, N = 8, 2, 8192
SPEC = parse_spec(
    {
        "d_model": D,
        "n_heads": 1,
        "d_ff": 1,
        "n_layers": 0,
        "positional": "none",
        "final_norm": False,
        "task": {"type": "regression", "seq_len": 1, "input_dim": None, "output_dim": K},
    }
)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny float64 problems: threads only contend
    yield
    torch.set_num_threads(threads)


def regression_data(seed: int) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 1, D, generator=g, dtype=torch.float64)
    w = torch.randn(K, D, generator=g, dtype=torch.float64)
    y = x @ w.T + 0.5 * torch.randn(N, 1, K, generator=g, dtype=torch.float64)
    return Dataset(x, y)


def closed_form(model, ds: Dataset) -> tuple[float, float, float]:
    """(|G|², tr Σ, B_noise) at the model's weights, exactly."""
    w, b = model.head.weight.detach(), model.head.bias.detach()
    x, y = ds.inputs[:, 0, :], ds.targets[:, 0, :]
    r = x @ w.T + b - y
    xt = torch.cat([x, torch.ones(N, 1, dtype=x.dtype)], 1)
    g = (2 / K) * r.T @ xt / N
    g2 = float((g * g).sum())
    tr = float(((4 / K**2) * (r * r).sum(1) * (xt * xt).sum(1)).mean()) - g2
    c = xt.T @ xt / N
    ghg = (2 / K) * float(torch.trace(g @ c @ g.T))
    tr_h = float(((2 / K) * (4 / K**2) * (r * r).sum(1) * ((xt @ c) * xt).sum(1)).mean()) - ghg
    return g2, tr, tr_h / ghg


def test_two_batch_b_simple_matches_the_closed_form_within_its_interval_at_each_checkpoint():
    covered, defined = [], 0
    for seed in range(2):
        ds = regression_data(seed)
        model = build_model(SPEC, seed=seed, dtype=torch.float64)
        exact: list[tuple[float, float, float]] = []
        point = PointSettings(
            type="batch", batch_size=32, lr=0.02, target_loss=1e-9, max_steps=160, eval_every=40
        )
        result = train_point(
            model,
            objective_for(SPEC),
            ds,
            ds.subset(slice(0, 512)),
            point,
            OptimizerSpec(name="sgd", lr=0.02, base_batch_size=32, warmup_steps=0),
            on_step=lambda _step, m, exact=exact, ds=ds: exact.append(closed_form(m, ds)),
        )
        windows = result.two_batch
        assert windows is not None and windows.b_small == 16
        for w, (small, big) in enumerate(
            zip(windows.grad_sq_norm_small, windows.grad_sq_norm_big, strict=True)
        ):
            start = windows.window_end_steps[w] - len(small)
            part = exact[start : start + len(small)]
            truth = np.mean([p[1] for p in part]) / np.mean([p[0] for p in part])
            g2, tr = two_batch_estimates(16, 32, np.array(small), np.array(big))
            _, _, ratio = ratio_of_means_bootstrap(
                tr,
                g2,
                confidence=0.95,
                bootstrap=500,
                rng=np.random.default_rng(100 * seed + w),
                formula="",
                names=("tr Σ", "|G|²"),
            )
            if ratio.value is None:
                continue
            defined += 1
            lo, hi = ratio.ci
            covered.append(lo <= truth <= hi)
            if w == 0:  # far from the minimum the signal is strong: the estimate is tight
                assert abs(ratio.value / truth - 1) < 0.25
    assert defined >= 6
    assert np.mean(covered) >= 0.85, covered


def test_fitted_b_crit_lies_in_the_closed_form_b_noise_range_between_start_and_target():
    ds = regression_data(0)
    evaluation = ds.subset(slice(0, 2048))
    target = 0.35
    steps: dict[int, float] = {}
    spans: list[float] = []
    opt = OptimizerSpec(name="sgd", lr=0.1, base_batch_size=8, warmup_steps=0, lr_rule="grid")
    for b in (4, 8, 16, 32, 64, 128):
        best = math.inf
        for mult in (0.25, 0.5, 1.0, 2.0, 4.0):  # the grid rule: keep the best learning rate
            lr = 0.1 * math.sqrt(b / 8) * mult
            model = build_model(SPEC, seed=0, dtype=torch.float64)
            record = b == 4 and mult == 1.0
            result = train_point(
                model,
                objective_for(SPEC),
                ds,
                evaluation,
                PointSettings(
                    type="batch",
                    batch_size=b,
                    lr=lr,
                    lr_multiplier=mult,
                    target_loss=target,
                    max_steps=3000,
                    eval_every=1,
                ),
                opt,
                on_step=(lambda _s, m: spans.append(closed_form(m, ds)[2])) if record else None,
            )
            if not result.censored:
                best = min(best, result.steps)
        steps[b] = best
    sizes = np.array(sorted(steps), dtype=float)
    fit = fit_steps_to_target(sizes, np.array([steps[int(b)] for b in sizes]), 0.95)
    b_noise_start, b_noise_target = spans[0], spans[-1]
    assert b_noise_start < b_noise_target  # the noise scale grows as the loss falls
    assert b_noise_start <= fit.b_crit <= b_noise_target, (fit.b_crit, spans[0], spans[-1])
