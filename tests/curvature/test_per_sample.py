"""Per-sample losses, perturbed losses and per-sample Hessian norms against exact oracles (fp64).

Oracles: the objective's own full-batch loss, a hand-written MSE, dense per-example Hessians
built column by column from double backward (this file's own code), numpy ``eigvalsh`` and the
closed form ‖2xxᵀ‖ = 2|x|² of linear regression.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from curvplan_worker.curvature import per_sample as ps
from curvplan_worker.curvature.model import build_model
from curvplan_worker.curvature.objective import (
    ClassificationObjective,
    RegressionObjective,
    objective_for,
)

torch.set_default_dtype(torch.float64)

LM_SPEC = {
    "d_model": 4,
    "n_heads": 2,
    "d_ff": 8,
    "n_layers": 1,
    "activation": "gelu",
    "norm_position": "post",
    "task": {"type": "causal_lm", "vocab_size": 5, "seq_len": 4},
}
CLS_SPEC = {
    "d_model": 4,
    "n_heads": 1,
    "d_ff": 6,
    "n_layers": 1,
    "activation": "relu",
    "norm_position": "pre",
    "task": {"type": "classification", "seq_len": 3, "input_dim": 3, "n_classes": 3},
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tanh_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def regression_data(n: int, seed: int = 1) -> tuple[Tensor, Tensor]:
    g = _gen(seed)
    return torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)


def lm_model_and_data(n: int = 6) -> tuple[nn.Module, object, Tensor, Tensor]:
    model = build_model(LM_SPEC, seed=3, dtype=torch.float64)
    with torch.no_grad():  # larger weights than the 0.02 init: a non-trivial Hessian
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=_gen(hash(p.shape) % 1000)))
    g = _gen(4)
    x = torch.randint(0, 5, (n, 4), generator=g)
    y = torch.randint(0, 5, (n, 4), generator=g)
    y[0, :3] = -100  # ragged counts: example 0 has one loss term
    y[1, 0] = -100
    return model, objective_for(LM_SPEC), x, y


def cls_model_and_data(n: int = 7) -> tuple[nn.Module, object, Tensor, Tensor]:
    model = build_model(CLS_SPEC, seed=5, dtype=torch.float64)
    g = _gen(6)
    return (
        model,
        ClassificationObjective(),
        torch.randn(n, 3, 3, generator=g),
        torch.randint(0, 3, (n,), generator=g),
    )


def flat_params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach() for k, v in model.named_parameters()}


def example_loss_fn(model: nn.Module, objective, x: Tensor, y: Tensor):
    """Flat parameter vector ↦ the example's mean loss s/c (independent of per_sample.py)."""
    names = [k for k, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]

    def f(flat: Tensor) -> Tensor:
        params, off = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            k = int(np.prod(shape))
            params[name] = flat[off : off + k].view(shape)
            off += k
        sums, counts = objective.example_losses(_Swap(model, params), x, y)
        return sums.sum() / counts.sum()

    return f


class _Swap(nn.Module):
    def __init__(self, model: nn.Module, params: dict[str, Tensor]) -> None:
        super().__init__()
        self.inner = model
        self.params = params

    def forward(self, x: Tensor) -> Tensor:
        return functional_call(self.inner, self.params, (x,))


def dense_gradient_and_hessian(f, w: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient and Hessian by double backward, one column per unit vector."""
    w = w.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(f(w), w, create_graph=True)
    eye = torch.eye(w.numel())
    (h,) = torch.autograd.grad(g, w, grad_outputs=eye, is_grads_batched=True)
    return g.detach(), 0.5 * (h + h.T).detach()


def flat_vector(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _validate_with_planner_schema(name: str, payload: dict) -> None:
    """Validate against the contract's pydantic model of the planner's inputs."""
    from curvplan.types import planner as schemas

    getattr(schemas, name)(**payload)


# ------------------------------------------------------------------------------ losses


@pytest.mark.parametrize("case", ["mlp", "lm", "cls"])
@pytest.mark.parametrize("batch_size", [1, 4, 100])
def test_per_example_losses_reproduce_full_batch_loss(case: str, batch_size: int) -> None:
    if case == "mlp":
        model, objective = tanh_mlp(), RegressionObjective()
        x, y = regression_data(9)
    elif case == "lm":
        model, objective, x, y = lm_model_and_data()
    else:
        model, objective, x, y = cls_model_and_data()
    losses = ps.per_example_losses(model, objective, x, y, batch_size)
    sums, counts = ps.per_example_loss_sums(model, objective, x, y, batch_size)
    with torch.no_grad():
        s_full, c_full = objective.example_losses(model, x, y)
        full = float(s_full.sum() / c_full.sum())
    assert losses.dtype == torch.float64 and losses.shape == (x.shape[0],)
    torch.testing.assert_close(losses, sums / counts)
    assert float(sums.sum() / counts.sum()) == pytest.approx(full, rel=1e-13)
    assert float((losses * counts).sum() / counts.sum()) == pytest.approx(full, rel=1e-13)
    if case == "lm":
        assert counts.tolist()[:2] == [1.0, 3.0]  # ragged: ignored targets are not counted
        assert float(losses.mean()) != pytest.approx(full, rel=1e-6)  # weighting matters
    else:
        assert float(losses.mean()) == pytest.approx(full, rel=1e-13)


def test_per_example_losses_match_hand_written_mse() -> None:
    model = tanh_mlp()
    x, y = regression_data(5)
    losses = ps.per_example_losses(model, RegressionObjective(), x, y, batch_size=2)
    with torch.no_grad():
        expected = ((model(x) - y) ** 2).mean(dim=1)
    torch.testing.assert_close(losses, expected, rtol=1e-14, atol=0)


def test_bad_sample_gives_errors_naming_the_field() -> None:
    model, objective = tanh_mlp(), RegressionObjective()
    x, y = regression_data(5)
    with pytest.raises(ValueError, match="targets"):
        ps.per_example_losses(model, objective, x, y[:4])
    with pytest.raises(ValueError, match="batch_size"):
        ps.per_example_losses(model, objective, x, y, batch_size=0)
    lm, lm_obj, tokens, targets = lm_model_and_data()
    targets[2] = -100
    with pytest.raises(ValueError, match=r"targets: examples \[2\]"):
        ps.per_example_losses(lm, lm_obj, tokens, targets)


def test_model_mode_restored_and_dropout_off() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.5), nn.Tanh(), nn.Linear(8, 2)).double()
    model.train()
    x, y = regression_data(6)
    a = ps.per_example_losses(model, RegressionObjective(), x, y)
    b = ps.per_example_losses(model, RegressionObjective(), x, y)
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # no dropout noise
    assert all(m.training for m in model.modules())  # the caller's mode is back
    model.eval()
    with torch.no_grad():
        expected = ((model(x) - y) ** 2).mean(dim=1)
    torch.testing.assert_close(a, expected)


# ------------------------------------------------------------------------------ directions


def test_random_unit_directions_are_unit_seeded_and_joint() -> None:
    model = tanh_mlp()
    params = ps.select_parameters(model)
    d1 = ps.random_unit_directions(params, 5, _gen(7))
    d2 = ps.random_unit_directions(params, 5, _gen(7))
    d3 = ps.random_unit_directions(params, 5, _gen(8))
    assert d1.shape == (5, sum(p.numel() for p in model.parameters()))
    torch.testing.assert_close(torch.linalg.vector_norm(d1, dim=1), torch.ones(5))
    torch.testing.assert_close(d1, d2, rtol=0, atol=0)
    assert not torch.allclose(d1, d3)


def test_random_subspace_directions_stay_in_the_span() -> None:
    q, _ = torch.linalg.qr(torch.randn(10, 3, generator=_gen(0)))
    basis = q.T  # 3 orthonormal rows in R^10
    d = ps.random_subspace_directions(basis, 4, _gen(1))
    torch.testing.assert_close(torch.linalg.vector_norm(d, dim=1), torch.ones(4))
    projected = (d @ basis.T) @ basis
    torch.testing.assert_close(projected, d)
    with pytest.raises(ValueError, match="basis"):
        ps.random_subspace_directions(2 * basis, 4, _gen(1))


def test_perturbed_losses_reject_bad_directions_and_radius() -> None:
    model, objective = tanh_mlp(), RegressionObjective()
    x, y = regression_data(4)
    dim = sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="directions"):
        ps.perturbed_losses(model, objective, x, y, 0.1, 2 * torch.eye(dim)[:2])
    with pytest.raises(ValueError, match="directions"):
        ps.perturbed_losses(model, objective, x, y, 0.1, torch.eye(dim + 1)[:2])
    with pytest.raises(ValueError, match="radius"):
        ps.perturbed_losses(model, objective, x, y, -0.1, 2)
    with pytest.raises(ValueError, match="param_names"):
        ps.perturbed_losses(model, objective, x, y, 0.1, 2, param_names=["nope"])


# ------------------------------------------------------------------------------ perturbed


@pytest.mark.parametrize("case", ["mlp", "lm"])
def test_perturbed_losses_match_second_order_taylor(case: str) -> None:
    if case == "mlp":
        model, objective = tanh_mlp(), RegressionObjective()
        x, y = regression_data(4)
    else:
        model, objective, x, y = lm_model_and_data(2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    w = flat_vector(model)
    dirs = ps.random_unit_directions(w.numel(), 3, _gen(11))
    base = ps.per_example_losses(model, objective, x, y)
    at_zero = ps.perturbed_losses(model, objective, x, y, 0.0, dirs)
    torch.testing.assert_close(at_zero, base.expand(3, -1), rtol=0, atol=0)
    oracle = [
        dense_gradient_and_hessian(example_loss_fn(model, objective, x[i : i + 1], y[i : i + 1]), w)
        for i in range(x.shape[0])
    ]
    for r in (1e-2, 5e-3):
        got = ps.perturbed_losses(model, objective, x, y, r, dirs, batch_size=3)
        for i, (g, h) in enumerate(oracle):
            for p in range(3):
                u = dirs[p]
                first = base[i] + r * (g @ u)
                taylor = first + 0.5 * r**2 * (u @ h @ u)
                err = abs(float(got[p, i] - taylor))
                assert err <= 20 * r**3 * max(1.0, float(h.abs().max())), (case, r, i, p, err)
                # the quadratic term is resolved: the first-order model is clearly worse
                if abs(float(u @ h @ u)) > 1e-3:
                    assert err < 0.2 * abs(float(got[p, i] - first))
    for k, v in model.state_dict().items():  # live weights never touched
        assert torch.equal(v, before[k])


def test_perturbed_losses_on_parameter_subset_and_record_schema() -> None:
    model, objective = tanh_mlp(), RegressionObjective()
    x, y = regression_data(5)
    names = ["2.weight"]
    dirs = ps.random_unit_directions(8, 2, _gen(3))
    got = ps.perturbed_losses(model, objective, x, y, 0.3, dirs, param_names=names)
    for p in range(2):
        moved = tanh_mlp()
        with torch.no_grad():
            moved[2].weight.add_(0.3 * dirs[p].view(2, 4))
            expected = ((moved(x) - y) ** 2).mean(dim=1)
        torch.testing.assert_close(got[p], expected)
    rec = ps.perturbed_losses_record(model, objective, x, y, 0.3, 2, seed=5, kind="random")
    again = ps.perturbed_losses(model, objective, x, y, 0.3, 2, seed=5)
    assert rec["losses"] == again.tolist() and rec["seed"] == 5
    _validate_with_planner_schema(
        "PerturbedLosses", {k: rec[k] for k in ("radius", "losses", "kind")}
    )
    with pytest.raises(ValueError, match="kind"):
        ps.perturbed_losses_record(model, objective, x, y, 0.3, 2, kind="eigen")


# ------------------------------------------------------------------------------ Lanczos / norms


def hessian_oracle(model: nn.Module, objective, x: Tensor, y: Tensor) -> np.ndarray:
    f = example_loss_fn(model, objective, x, y)
    _, h = dense_gradient_and_hessian(f, flat_vector(model))
    return np.linalg.eigvalsh(h.numpy())


@pytest.mark.parametrize("case", ["mlp", "lm", "cls"])
def test_per_sample_hessian_norms_match_dense_eigvalsh(case: str) -> None:
    if case == "mlp":
        model, objective = tanh_mlp(), RegressionObjective()
        x, y = regression_data(6)
    elif case == "lm":
        model, objective, x, y = lm_model_and_data(6)
    else:
        model, objective, x, y = cls_model_and_data(6)
    model.train()
    out = ps.per_sample_hessian_norms(model, objective, x, y, n_subsample=2, seed=2, tol=1e-10)
    assert model.training
    assert out["all_converged"] and len(out["indices"]) == 2
    for k, i in enumerate(out["indices"]):
        ev = hessian_oracle(model, objective, x[i : i + 1], y[i : i + 1])
        scale = max(abs(ev[0]), abs(ev[-1]))
        assert out["lambda_max"][k] == pytest.approx(ev[-1], abs=1e-8 * scale)
        assert out["lambda_min"][k] == pytest.approx(ev[0], abs=1e-8 * scale)
        assert out["norms"][k] == pytest.approx(scale, rel=1e-8)
    assert out["max"] == max(out["norms"])
    assert out["quantiles"]["q50"] == pytest.approx(float(np.median(out["norms"])))
    assert out["quantiles"]["q99"] <= out["max"]


def test_per_sample_hessian_norms_linear_regression_closed_form() -> None:
    model = nn.Linear(4, 1, bias=False).double()
    x = torch.randn(5, 4, generator=_gen(9))
    y = torch.randn(5, 1, generator=_gen(10))
    out = ps.per_sample_hessian_norms(model, RegressionObjective(), x, y, n_subsample=None)
    expected = (2 * (x**2).sum(dim=1)).tolist()  # ∇²(xᵀw − y)² = 2xxᵀ, rank one
    assert out["indices"] == list(range(5)) and out["all_converged"]
    np.testing.assert_allclose(out["norms"], expected, rtol=1e-10)
    np.testing.assert_allclose(out["lambda_min"], 0.0, atol=1e-10 * max(expected))


def test_per_sample_hessian_norms_subsample_is_seeded_and_flags_nonconvergence() -> None:
    model, objective = tanh_mlp(), RegressionObjective()
    x, y = regression_data(10)
    a = ps.per_sample_hessian_norms(model, objective, x, y, n_subsample=4, seed=1, max_iter=60)
    b = ps.per_sample_hessian_norms(model, objective, x, y, n_subsample=4, seed=1, max_iter=60)
    assert a["indices"] == b["indices"] and a["norms"] == b["norms"]
    capped = ps.per_sample_hessian_norms(
        model, objective, x, y, indices=[0, 1], tol=1e-12, max_iter=2
    )
    assert capped["converged"] == [False, False] and not capped["all_converged"]
    with pytest.raises(ValueError, match="indices"):
        ps.per_sample_hessian_norms(model, objective, x, y, indices=[10])
    with pytest.raises(ValueError, match="tol"):
        ps.per_sample_hessian_norms(model, objective, x, y, indices=[0], tol=0.0)


TIED_SPEC = {
    "d_model": 4,
    "n_heads": 2,
    "d_ff": 6,
    "n_layers": 1,
    "activation": "gelu",
    "task": {"type": "causal_lm", "vocab_size": 5, "seq_len": 4, "tie_embeddings": True},
}


def test_tied_embeddings_are_perturbed_once_and_together() -> None:
    model = build_model(TIED_SPEC, seed=2, dtype=torch.float64)
    objective = objective_for(TIED_SPEC)
    g = _gen(3)
    x = torch.randint(0, 5, (5, 4), generator=g)
    y = torch.randint(0, 5, (5, 4), generator=g)
    names = list(ps.select_parameters(model))
    assert "head.weight" not in names  # the tied head belongs to the embedding's tensor
    d = ps.random_unit_directions(ps.select_parameters(model), 2, g)
    got = ps.perturbed_losses(model, objective, x, y, 0.5, d)
    for p in range(2):
        moved = copy.deepcopy(model)
        with torch.no_grad():  # in-place on a private copy: the head moves with the embedding
            off = 0
            for _, t in moved.named_parameters():
                t.add_(0.5 * d[p, off : off + t.numel()].view_as(t))
                off += t.numel()
        torch.testing.assert_close(got[p], ps.per_example_losses(moved, objective, x, y))


def test_per_sample_section_and_planner_fields() -> None:
    from curvplan.types.results import PerSample
    from curvplan_worker.analyze.planner_inputs import planner_measurements
    from curvplan_worker.curvature.measured import clean

    model, objective, x, y = lm_model_and_data(6)
    eig = torch.linalg.qr(torch.randn(sum(p.numel() for p in model.parameters()), 2))[0].T
    section = ps.per_sample_section(
        model,
        objective,
        x,
        y,
        radius=0.1,
        n_directions=3,
        eigen_directions=eig,
        n_hessian_subsample=2,
        seed=4,
        tol=1e-8,
    )
    torch.testing.assert_close(
        torch.tensor(section["losses"]), ps.per_example_losses(model, objective, x, y)
    )
    assert [p["kind"] for p in section["perturbed"]] == ["random", "top_eigenspace"]
    assert len(section["perturbed"][0]["losses"]) == 3
    assert len(section["perturbed"][1]["losses"]) == 2
    assert section["hessian_norms"]["all_converged"]
    fields, notes = planner_measurements(PerSample.model_validate(clean(section)))
    assert fields["perturbed_losses"]["kind"] == "random" and notes
    assert fields["per_sample_hessian_norms"] == section["hessian_norms"]["norms"]
    try:
        from curvplan.types.planner import Measurements
    except ImportError:  # the planner is built in parallel; the field names are checked above
        assert set(fields) == {"per_sample_losses", "perturbed_losses", "per_sample_hessian_norms"}
        return
    Measurements(**fields)
    with pytest.raises(ValueError, match="radius"):
        ps.per_sample_section(model, objective, x, y, radius=0.0)


def test_float32_model_agrees_with_float64() -> None:
    model64, objective, x, y = lm_model_and_data(6)
    model32 = copy.deepcopy(model64).float()
    l64 = ps.per_example_losses(model64, objective, x, y)
    l32 = ps.per_example_losses(model32, objective, x, y)
    assert l32.dtype == torch.float64  # accumulated in fp64 whatever the model's precision
    torch.testing.assert_close(l32, l64, rtol=1e-5, atol=0)
    n64 = ps.per_sample_hessian_norms(model64, objective, x, y, indices=[0, 3], tol=1e-5)
    n32 = ps.per_sample_hessian_norms(model32, objective, x, y, indices=[0, 3], tol=1e-5)
    assert n32["all_converged"]
    np.testing.assert_allclose(n32["norms"], n64["norms"], rtol=1e-4)
