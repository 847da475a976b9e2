"""Gradient-noise statistics: exactness on closed forms and unbiasedness on a known population.

Population (linear regression, MSE, everything analytic): x ~ N(0, S), y = xᵀw₀ + ε,
ε ~ N(0, σ²), loss l = (xᵀw − y)², evaluated at w = w₀ + r. Per-example gradient
g = 2x(xᵀr − ε), so with Isserlis' theorem
    G = 2Sr,  H = 2S,  Σ = 4(rᵀSr + σ²)S + 4Srrᵀ S,
    |G|² = 4|Sr|²,  tr Σ = 4(rᵀSr + σ²) tr S + 4|Sr|²,
    GᵀHG = 8 rᵀS³r,  tr(HΣ) = 8(rᵀSr + σ²) tr S² + 8 rᵀS³r.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from curvplan.types.results import GradientNoiseEstimate
from curvplan_core import cost_model
from curvplan_worker.analyze.planner_inputs import planner_gradient_noise
from curvplan_worker.curvature import gradient_noise as gn
from curvplan_worker.curvature.measured import clean
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import RegressionObjective, objective_for

torch.set_default_dtype(torch.float64)

D = 4
SIGMA = 0.7
LM_SPEC = {
    "d_model": 4,
    "n_heads": 2,
    "d_ff": 8,
    "n_layers": 1,
    "activation": "gelu",
    "task": {"type": "causal_lm", "vocab_size": 5, "seq_len": 4},
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Population:
    """The analytic linear-regression population of the module docstring."""

    def __init__(self, seed: int = 0) -> None:
        g = _gen(seed)
        a = torch.randn(D, D, generator=g)
        self.s = a @ a.T / D + 0.5 * torch.eye(D)
        self.chol = torch.linalg.cholesky(self.s)
        self.w0 = torch.randn(D, generator=g)
        self.r = 0.6 * torch.randn(D, generator=g)
        s, r = self.s, self.r
        sr = s @ r
        rsr = float(r @ sr)
        self.grad_sq_norm = 4 * float(sr @ sr)
        self.trace_sigma = 4 * (rsr + SIGMA**2) * float(torch.trace(s)) + 4 * float(sr @ sr)
        self.gHg = 8 * float(sr @ s @ sr)
        self.trace_h_sigma = 8 * (rsr + SIGMA**2) * float(torch.trace(s @ s)) + 8 * float(
            sr @ s @ sr
        )

    def model(self) -> nn.Module:
        m = nn.Linear(D, 1, bias=False)
        with torch.no_grad():
            m.weight.copy_((self.w0 + self.r).view(1, D))
        return m

    def draw(self, n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
        x = torch.randn(n, D, generator=g) @ self.chol.T
        y = x @ self.w0 + SIGMA * torch.randn(n, generator=g)
        return x, y.view(n, 1)


def lm_model_and_data(n: int = 8) -> tuple[nn.Module, object, Tensor, Tensor]:
    model = build_model(LM_SPEC, seed=3, dtype=torch.float64)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.3 * torch.randn(p.shape, generator=_gen(100 + i)))
    g = _gen(4)
    x = torch.randint(0, 5, (n, 4), generator=g)
    y = torch.randint(0, 5, (n, 4), generator=g)
    y[0, :3] = -100
    y[1, 0] = -100
    return model, objective_for(LM_SPEC), x, y


# ------------------------------------------------------------------------------ exactness


def test_vmap_per_example_gradients_equal_the_closed_form() -> None:
    pop = Population()
    model = pop.model()
    x, y = pop.draw(9, _gen(1))
    out = gn.per_example_gradients(model, RegressionObjective(), x, y, chunk_size=4, method="vmap")
    w = (pop.w0 + pop.r).view(D, 1)
    expected = 2 * x * (x @ w - y)  # ∇(xᵀw − y)² per example, count 1
    assert out.method == "vmap" and out.mean_count == 1.0
    torch.testing.assert_close(out.grads, expected, rtol=1e-13, atol=1e-13)


def test_per_example_gradients_ragged_lm_vmap_equals_loop_and_mean_is_the_loss_gradient() -> None:
    model, objective, x, y = lm_model_and_data()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    vm = gn.per_example_gradients(model, objective, x, y, chunk_size=3, method="vmap")
    lp = gn.per_example_gradients(model, objective, x, y, method="loop")
    assert model.training  # caller's mode restored
    torch.testing.assert_close(vm.grads, lp.grads, rtol=1e-10, atol=1e-13)
    model.eval()
    sums, counts = objective.example_losses(model, x, y)
    loss = sums.sum() / counts.sum()  # mean token loss: the Hessian's normalisation
    full = torch.autograd.grad(loss, list(model.parameters()))
    full_flat = torch.cat([t.reshape(-1) for t in full])
    torch.testing.assert_close(vm.grads.mean(dim=0), full_flat, rtol=1e-10, atol=1e-13)
    assert vm.counts.tolist()[:2] == [1.0, 3.0]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def dense_hessian(model: nn.Module, objective, x: Tensor, y: Tensor) -> Tensor:
    """Hessian of the batch's mean loss over all parameters: double backward, all unit columns."""
    params = list(model.parameters())
    sums, counts = objective.example_losses(model, x, y)
    grads = torch.autograd.grad(sums.sum() / counts.sum(), params, create_graph=True)
    flat = torch.cat([g.reshape(-1) for g in grads])
    eye = torch.eye(flat.numel())
    cols = torch.autograd.grad(flat, params, grad_outputs=eye, is_grads_batched=True)
    h = torch.cat([c.reshape(flat.numel(), -1) for c in cols], dim=1)
    return 0.5 * (h + h.T)


def test_hessian_quadratic_forms_match_the_dense_hessian() -> None:
    model, objective, x, y = lm_model_and_data(7)
    vectors = torch.randn(3, sum(p.numel() for p in model.parameters()), generator=_gen(5))
    forms = gn.hessian_quadratic_forms(model, objective, x, y, vectors, batch_size=2, n_groups=3)
    h = dense_hessian(model, objective, x, y)
    torch.testing.assert_close(forms.total, vectors @ h @ vectors.T, rtol=1e-10, atol=1e-12)
    groups = torch.tensor_split(torch.arange(7), 3)
    assert forms.forms.shape == (3, 3, 3)
    for b, idx in enumerate(groups):
        hb = dense_hessian(model, objective, x[idx], y[idx])
        torch.testing.assert_close(
            forms.forms[b] / forms.counts[b], vectors @ hb @ vectors.T, rtol=1e-10, atol=1e-12
        )
    assert forms.n_products == 3 * 4  # 3 vectors × 4 micro-batches (3+2 → 2+1, 2)


def test_estimators_equal_the_textbook_formulas() -> None:
    pop = Population()
    model = pop.model()
    xa, ya = pop.draw(10, _gen(2))
    xb, yb = pop.draw(12, _gen(3))
    out = gn.gradient_noise_statistics(model, RegressionObjective(), xa, ya, xb, yb, batch_size=5)
    g = gn.per_example_gradients(model, RegressionObjective(), xa, ya).grads
    n = g.shape[0]
    mean = g.mean(dim=0)
    cov = torch.cov(g.T)  # (1/(n−1)) Σ (g_i − ḡ)(g_i − ḡ)ᵀ
    h_b = 2 * xb.T @ xb / xb.shape[0]  # exact Hessian of the mean squared error on batch B
    trace_sigma = float(torch.trace(cov))
    trace_h_sigma = float(torch.trace(h_b @ cov))
    assert out["trace_sigma"] == pytest.approx(trace_sigma, rel=1e-12)
    assert out["grad_sq_norm"] == pytest.approx(float(mean @ mean) - trace_sigma / n, rel=1e-12)
    assert out["trace_h_sigma"] == pytest.approx(trace_h_sigma, rel=1e-12)
    assert out["gHg"] == pytest.approx(float(mean @ h_b @ mean) - trace_h_sigma / n, rel=1e-12)
    assert out["gradient_norm"] == pytest.approx(float(torch.linalg.vector_norm(mean)), rel=1e-12)
    assert out["b_simple"] == pytest.approx(out["trace_sigma"] / out["grad_sq_norm"])
    assert out["b_noise"] == pytest.approx(out["trace_h_sigma"] / out["gHg"])
    assert out["n_samples"] == 10 and out["n_hessian_samples"] == 12
    assert out["n_hessian_groups"] == 4 and out["hessian_se_includes_batch"]


# ------------------------------------------------------------------------------ unbiasedness


def _draws(pop: Population, n_draws: int, n_a: int, n_b: int, *, same_batch: bool = False):
    model = pop.model()
    objective = RegressionObjective()
    g = _gen(12345)
    rows = []
    for _ in range(n_draws):
        xa, ya = pop.draw(n_a, g)
        xb, yb = (xa, ya) if same_batch else pop.draw(n_b, g)
        out = gn.gradient_noise_statistics(
            model, objective, xa, ya, xb, yb, batch_size=n_b, n_hessian_groups=2, b_small=2, b_big=4
        )
        rows.append(out)
    return rows


def _mean_and_se(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values)
    return float(arr.mean()), float(arr.std(ddof=1) / math.sqrt(arr.size))


@pytest.fixture(scope="module")
def independent_draws() -> tuple[Population, list[dict]]:
    pop = Population()
    return pop, _draws(pop, 400, 8, 8)


@pytest.mark.parametrize("key", ["grad_sq_norm", "trace_sigma", "gHg", "trace_h_sigma"])
def test_estimators_are_unbiased_on_the_analytic_population(independent_draws, key) -> None:
    pop, rows = independent_draws
    truth = getattr(pop, key)
    mean, se = _mean_and_se([r[key] for r in rows])
    assert abs(mean - truth) <= 2 * se, (key, mean, truth, se)
    # the reported per-draw standard error describes the spread of the estimate
    spread = float(np.std([r[key] for r in rows], ddof=1))
    reported = float(np.sqrt(np.mean([r[f"{key}_se"] ** 2 for r in rows])))
    assert 0.6 <= reported / spread <= 1.6, (key, reported, spread)


def test_the_unbiasedness_test_has_power(independent_draws) -> None:
    """The plug-in estimators |ḡ|² and ḡᵀH_Bḡ are rejected by the same 2-SE criterion."""
    pop, rows = independent_draws
    raw = [r["raw_grad_sq_norm"] for r in rows]
    mean, se = _mean_and_se(raw)
    assert abs(mean - pop.grad_sq_norm) > 5 * se
    plug_in = [r["gHg"] + r["trace_h_sigma"] / r["n_samples"] for r in rows]
    mean, se = _mean_and_se(plug_in)
    assert abs(mean - pop.gHg) > 5 * se


def test_hessian_from_the_gradient_batch_is_biased() -> None:
    """Why H must come from an independent batch: reusing A biases tr(HΣ)
    (docs/formulas.md#batch-size)."""
    pop = Population()
    rows = _draws(pop, 250, 6, 6, same_batch=True)
    mean, se = _mean_and_se([r["trace_h_sigma"] for r in rows])
    assert abs(mean - pop.trace_h_sigma) > 4 * se, (mean, pop.trace_h_sigma, se)


def test_two_batch_series_app_a_estimates_are_unbiased(independent_draws) -> None:
    pop, rows = independent_draws
    for key, truth in (
        ("app_a_grad_sq_norm", pop.grad_sq_norm),
        ("app_a_trace_sigma", pop.trace_sigma),
    ):
        mean, se = _mean_and_se([r["series"][key] for r in rows])
        assert abs(mean - truth) <= 2 * se, (key, mean, truth, se)


# ------------------------------------------------------------------------------ series, guards


def test_two_batch_series_entries_and_guards() -> None:
    g = torch.randn(9, 5, generator=_gen(0))
    hmat = torch.randn(5, 5, generator=_gen(1))
    hmat = hmat @ hmat.T
    out = gn.two_batch_series(g @ g.T, 2, 4, hessian_gram=g @ hmat @ g.T)
    assert len(out["grad_sq_norm_big"]) == 2  # 9 examples → two disjoint batches of 4
    for t in range(2):
        big = g[4 * t : 4 * t + 4].mean(dim=0)
        smalls = [g[4 * t + 2 * j : 4 * t + 2 * j + 2].mean(dim=0) for j in range(2)]
        assert out["grad_sq_norm_big"][t] == pytest.approx(float(big @ big))
        assert out["grad_sq_norm_small"][t] == pytest.approx(float(sum(s @ s for s in smalls)) / 2)
        assert out["gHg_big"][t] == pytest.approx(float(big @ hmat @ big))
    with pytest.raises(ValueError, match="b_big"):
        gn.two_batch_series(g @ g.T, 4, 4)
    with pytest.raises(ValueError, match="b_small"):
        gn.two_batch_series(g @ g.T, 4, 2)
    with pytest.raises(ValueError, match="b_big"):
        gn.two_batch_series(g @ g.T, 2, 10)


def test_sample_split_is_disjoint_seeded_and_validated() -> None:
    model, objective, x, y = lm_model_and_data(10)
    a = gn.gradient_noise_from_sample(model, objective, x, y, n_grad=6, seed=3, batch_size=4)
    b = gn.gradient_noise_from_sample(model, objective, x, y, n_grad=6, seed=3, batch_size=4)
    assert a == b
    assert not set(a["grad_indices"]) & set(a["hessian_indices"])
    assert len(a["grad_indices"]) == 6 and len(a["hessian_indices"]) == 4
    assert a["gradient_method"] == "vmap"
    assert (a["series"]["b_small"], a["series"]["b_big"]) == gn.default_series_sizes(6) == (1, 3)
    pop = Population()
    big_x, big_y = pop.draw(300, _gen(1))
    split = gn.gradient_noise_from_sample(
        pop.model(), RegressionObjective(), big_x, big_y, batch_size=64
    )
    assert split["n_samples"] == gn.DEFAULT_MAX_GRAD_EXAMPLES
    assert split["n_hessian_samples"] == gn.DEFAULT_MAX_HESSIAN_EXAMPLES
    with pytest.raises(ValueError, match="n_grad"):
        gn.gradient_noise_from_sample(model, objective, x, y, n_grad=10)
    with pytest.raises(ValueError, match="hessian_inputs"):
        gn.gradient_noise_statistics(model, objective, x, y, x)


@pytest.mark.parametrize(
    ("n", "options"),
    [
        (5, {}),
        (10, {"noise_grad_examples": 6}),
        (40, {"noise_max_groups": 4}),
        (300, {}),
        (300, {"noise_grad_examples": 20, "noise_hessian_examples": 7}),
    ],
)
def test_the_cost_model_counts_the_products_the_statistics_make(n, options) -> None:
    """``cost_model.noise_split`` (what prices the stage before it runs) against the engine's
    own split and its count of Hessian-vector products: one per gradient group and Hessian
    group."""
    pop = Population()
    x, y = pop.draw(n, _gen(2))
    opts = cost_model.CostOptions.from_options(options)
    out = gn.gradient_noise_from_sample(
        pop.model(),
        RegressionObjective(),
        x,
        y,
        n_grad=options.get("noise_grad_examples"),
        n_hessian=options.get("noise_hessian_examples"),
        max_groups=opts.noise_max_groups,
        batch_size=64,
    )
    grads, hessian, k, groups = cost_model.noise_split(n, opts)
    assert (len(out["grad_indices"]), len(out["hessian_indices"])) == (grads, hessian)
    assert out["n_hvp_products"] == k * groups


def test_without_a_hessian_batch_only_the_simple_pair_is_estimated() -> None:
    pop = Population()
    x, y = pop.draw(6, _gen(8))
    out = gn.gradient_noise_statistics(pop.model(), RegressionObjective(), x, y)
    assert out["gHg"] is None and out["trace_h_sigma"] is None and out["b_noise"] is None
    assert out["trace_sigma"] > 0


def test_planner_dict_passes_a_negative_grad_sq_norm_through_unclamped() -> None:
    stats = {
        "grad_sq_norm": -0.5,
        "grad_sq_norm_se": 0.4,
        "trace_sigma": 3.0,
        "trace_sigma_se": 0.2,
        "gHg": -0.1,
        "gHg_se": 0.05,
        "trace_h_sigma": 2.0,
        "trace_h_sigma_se": 0.3,
        "n_samples": 8,
        "b_simple": None,
    }
    out, notes = planner_gradient_noise(GradientNoiseEstimate.model_validate(stats))
    # the pair is kept as measured: neither dropped nor clamped to 0 (pitfall 13)
    assert out["grad_sq_norm"] == -0.5 and out["trace_sigma"] == 3.0
    assert out["grad_sq_norm_se"] == 0.4 and out["gHg"] == -0.1
    assert len(notes) == 2 and "|G|²" in notes[0] and "GᵀHG" in notes[1]
    positive, none = planner_gradient_noise(
        GradientNoiseEstimate.model_validate({**stats, "grad_sq_norm": 0.5, "gHg": 0.1})
    )
    assert positive["grad_sq_norm"] == 0.5 and not none
    from curvplan.types.planner import DirectNoiseStats
    from curvplan_core.planner import Measurements, Targets, make_plan

    DirectNoiseStats(**out)
    DirectNoiseStats(**positive)
    plan = make_plan(Measurements(gradient_noise=DirectNoiseStats(**out)), Targets())
    batch = plan.batch_size
    assert batch.b_simple.status == "not_computed" and batch.b_noise.status == "not_computed"
    assert batch.grad_sq_norm.value == -0.5
    assert {"b_simple_undefined", "b_noise_undefined"} <= {w.code for w in plan.warnings}


def test_planner_direct_stats_carry_the_engine_record() -> None:
    model, objective, x, y = lm_model_and_data(10)
    stats = gn.gradient_noise_from_sample(model, objective, x, y, n_grad=6, batch_size=3)
    direct, _ = planner_gradient_noise(GradientNoiseEstimate.model_validate(clean(stats)))
    assert direct["gHg"] == stats["gHg"]
    assert direct["grad_sq_norm"] == stats["grad_sq_norm"]
    assert direct.get("n_samples") == stats["n_samples"]
    from curvplan.types.planner import Measurements

    Measurements.model_validate({"gradient_noise": direct})


def test_tied_embedding_per_example_gradients_average_to_the_loss_gradient() -> None:
    spec = {**LM_SPEC, "task": {**LM_SPEC["task"], "tie_embeddings": True}}
    model = build_model(spec, seed=1, dtype=torch.float64)
    objective = objective_for(spec)
    g = _gen(2)
    x = torch.randint(0, 5, (6, 4), generator=g)
    y = torch.randint(0, 5, (6, 4), generator=g)
    pg = gn.per_example_gradients(model, objective, x, y, method="vmap")
    assert "head.weight" not in pg.param_names
    sums, counts = objective.example_losses(model, x, y)
    full = torch.autograd.grad(sums.sum() / counts.sum(), list(model.parameters()))
    full_flat = torch.cat([t.reshape(-1) for t in full])  # the tied tensor gets both paths
    torch.testing.assert_close(pg.grads.mean(dim=0), full_flat, rtol=1e-10, atol=1e-13)


def test_float32_model_agrees_with_float64() -> None:
    """The engine's default precision is fp32; accumulation is fp64 either way."""
    model64, objective, x, y = lm_model_and_data(10)
    model32 = copy.deepcopy(model64).float()
    a = gn.gradient_noise_from_sample(model64, objective, x, y, n_grad=6, batch_size=4)
    b = gn.gradient_noise_from_sample(model32, objective, x, y, n_grad=6, batch_size=4)
    for key in ("trace_sigma", "trace_h_sigma", "raw_grad_sq_norm"):
        assert b[key] == pytest.approx(a[key], rel=1e-4), key
    by_name_a: Mapping[str, object] = a
    by_name_b: Mapping[str, object] = b
    for key in ("grad_sq_norm", "gHg"):  # differences of large terms: absolute tolerance
        assert by_name_b[key] == pytest.approx(by_name_a[key], abs=1e-4 * a["trace_sigma"]), key
