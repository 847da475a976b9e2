"""A branch starts from a warmed optimizer. Known answer: linear regression, whose per-batch
gradients are closed-form, so Adam's moments after the warm-up and the first counted step are
computed independently here (numpy, float64, Kingma & Ba 2015 Algorithm 1) and compared with
the sweep's own training function; and a saved optimizer state, read back from safetensors,
continues exactly as the optimizer that wrote it."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from curvplan.types.spec import parse_spec  # noqa: E402
from curvplan.types.sweep import OptimizerSpec, PointSettings  # noqa: E402
from curvplan_worker.curvature.checkpoint import CheckpointError, CheckpointMismatch  # noqa: E402
from curvplan_worker.curvature.data import Dataset  # noqa: E402
from curvplan_worker.curvature.model import build_model  # noqa: E402
from curvplan_worker.curvature.objective import objective_for  # noqa: E402
from curvplan_worker.sweep.moments import (  # noqa: E402
    apply_moments,
    read_moments,
    save_moments,
    warmup_order,
)
from curvplan_worker.sweep.train import train_point  # noqa: E402

D, K, N, B = 4, 2, 256, 16
BETA1, BETA2, ADAM_EPS = 0.9, 0.999, 1e-8  # torch's AdamW defaults
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


def _data() -> Dataset:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, 1, D, generator=g, dtype=torch.float64)
    w = torch.randn(K, D, generator=g, dtype=torch.float64)
    y = x @ w.T + 0.7 * torch.randn(N, 1, K, generator=g, dtype=torch.float64)
    return Dataset(x, y)


def _model():  # type: ignore[no-untyped-def]
    model = build_model(SPEC, seed=5, dtype=torch.float64)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {"head.weight", "head.bias"}, names  # the closed form below is complete
    return model


def _gradient(w: np.ndarray, b: np.ndarray, ds: Dataset, idx: np.ndarray) -> np.ndarray:
    """d/dθ of the mean squared error over the batch's B·K terms, θ = (W, b) flattened."""
    x, y = ds.inputs.numpy()[idx, 0, :], ds.targets.numpy()[idx, 0, :]
    r = x @ w.T + b - y
    scale = 2.0 / (len(idx) * K)
    return np.concatenate([(scale * r.T @ x).ravel(), scale * r.sum(0)])


def _adam_after(grads: list[np.ndarray], lr: float, theta: np.ndarray) -> np.ndarray:
    """θ after Adam with the first len(grads) − 1 steps at learning rate 0 and the last at lr."""
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    for g in grads:
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
    t = len(grads)
    m_hat, v_hat = m / (1 - BETA1**t), v / (1 - BETA2**t)
    return theta - lr * m_hat / (np.sqrt(v_hat) + ADAM_EPS)


def _theta(model) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.concatenate(
        [model.head.weight.detach().numpy().ravel(), model.head.bias.detach().numpy()]
    )


@pytest.mark.parametrize("warm", [0, 12])
def test_the_first_counted_step_is_adams_from_moments_warmed_on_the_branchs_batches(warm) -> None:
    ds, lr, seed = _data(), 0.05, 3
    model = _model()
    w0, b0 = model.head.weight.detach().numpy().copy(), model.head.bias.detach().numpy().copy()
    start = _theta(model)
    point = PointSettings(
        type="branch",
        batch_size=B,
        lr=lr,
        max_steps=1,
        eval_every=1,
        seed=seed,
        moment_warmup_steps=warm,
    )
    spec = OptimizerSpec(name="adamw", lr=lr, base_batch_size=B, warmup_steps=0)
    result = train_point(model, objective_for(SPEC), ds, ds, point, spec)
    # the independent answer: warm-up batches of B from their own order, then the window's
    # first batch (the branch order every batch size shares), all at the checkpoint's weights
    warm_idx = warmup_order(N, seed).numpy()
    window_idx = torch.randperm(N, generator=torch.Generator().manual_seed(seed * 1_000_003))
    batches = [warm_idx[(i * B + np.arange(B)) % N] for i in range(warm)]
    batches.append(window_idx[:B].numpy())
    expected = _adam_after([_gradient(w0, b0, ds, idx) for idx in batches], lr, start)
    np.testing.assert_allclose(_theta(model), expected, rtol=1e-9, atol=1e-12)
    assert ("warmed over 12 steps" in result.optimizer_start) == (warm == 12)
    assert (result.optimizer_start == "fresh") == (warm == 0)
    # the warm-up moved no weight: the window starts at the checkpoint's loss either way
    fresh = train_point(_model(), objective_for(SPEC), ds, ds, point, spec)
    assert result.eval_losses[0] == fresh.eval_losses[0]
    if warm:  # a fresh first step is ±lr per coordinate; the warmed one is not
        fresh_step = np.abs(expected - start)
        assert not np.allclose(fresh_step, lr, rtol=1e-3)


def _train_a_few_steps(model, ds: Dataset, steps: int):  # type: ignore[no-untyped-def]
    objective = objective_for(SPEC)
    opt = torch.optim.AdamW(model.parameters(), lr=0.03, weight_decay=0.0)
    for i in range(steps):
        idx = torch.arange(i * B, (i + 1) * B) % N
        opt.zero_grad(set_to_none=True)
        losses, counts = objective.example_losses(model, ds.inputs[idx], ds.targets[idx])
        (losses.sum() / counts.sum()).backward()
        opt.step()
    return opt


def test_a_saved_optimizer_state_continues_exactly_as_the_optimizer_that_wrote_it(
    tmp_path: Path,
) -> None:
    ds = _data()
    model = _model()
    opt = _train_a_few_steps(model, ds, 7)
    path = tmp_path / "step_7.optimizer.safetensors"
    save_moments(model, opt, path)
    branch = _model()
    branch.load_state_dict(model.state_dict())
    moments = read_moments(path, branch)
    assert moments.step == 7
    branch_opt = torch.optim.AdamW(branch.parameters(), lr=0.03, weight_decay=0.0)
    apply_moments(branch_opt, branch, moments)
    objective = objective_for(SPEC)
    for m, o in ((model, opt), (branch, branch_opt)):  # one more step on the same batch
        idx = torch.arange(100, 100 + B)
        o.zero_grad(set_to_none=True)
        losses, counts = objective.example_losses(m, ds.inputs[idx], ds.targets[idx])
        (losses.sum() / counts.sum()).backward()
        o.step()
    for (name, p), q in zip(model.named_parameters(), branch.parameters(), strict=True):
        assert torch.equal(p, q), name
    # the sweep's training function starts a branch from the same file, saying so
    point = PointSettings(type="branch", batch_size=B, lr=0.03, max_steps=2, eval_every=1)
    spec = OptimizerSpec(name="adamw", lr=0.03, base_batch_size=B, warmup_steps=0)
    run = train_point(_model(), objective, ds, ds, point, spec, moments=moments)
    assert "optimizer state at step 7" in run.optimizer_start


def test_an_optimizer_state_that_does_not_fit_is_refused_naming_the_problem(
    tmp_path: Path,
) -> None:
    from safetensors.torch import save_file

    model = _model()
    pickled = tmp_path / "optimizer.pt"
    pickled.write_bytes(pickle.dumps({"state": {}}))  # a pickle is never read
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        read_moments(pickled, model)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    good = {f"{k}.{n}": torch.ones(s, dtype=torch.float64) for n, s in shapes.items() for k in
            ("exp_avg", "exp_avg_sq")}  # fmt: skip
    no_step = tmp_path / "no_step.safetensors"
    save_file(good, str(no_step))
    with pytest.raises(CheckpointError, match="integer `step`"):
        read_moments(no_step, model)
    wrong = dict(good)
    wrong["exp_avg.head.weight"] = torch.ones(3, 3, dtype=torch.float64)
    del wrong["exp_avg_sq.head.bias"]
    bad = tmp_path / "bad.safetensors"
    save_file(wrong, str(bad), metadata={"step": "4"})
    with pytest.raises(CheckpointMismatch) as err:
        read_moments(bad, model)
    assert "exp_avg.head.weight" in str(err.value) and "exp_avg_sq.head.bias" in str(err.value)
    negative = dict(good)
    negative["exp_avg_sq.head.bias"] = -torch.ones(K, dtype=torch.float64)
    save_file(negative, str(bad), metadata={"step": "4"})
    with pytest.raises(CheckpointError, match="negative"):
        read_moments(bad, model)
