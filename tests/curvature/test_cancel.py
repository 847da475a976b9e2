"""Cooperative cancel inside the engine's loops: once ``should_cancel()`` turns True, every long
loop stops within one more unit of work (one operator product, one micro-batch, one example)
instead of running to the end of its block or stage.

The oracle is a count of the work done after the request: products of a counting operator, or
forward evaluations of a counting objective.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from curvplan.types.options import MachineSettings
from curvplan_worker.curvature import analyze as api
from curvplan_worker.curvature import gradient_noise as gn
from curvplan_worker.curvature import per_sample
from curvplan_worker.curvature.cancel import Cancelled, cancel_scope, check_cancel
from curvplan_worker.curvature.objective import RegressionObjective
from curvplan_worker.curvature.spectra import lanczos_spectrum
from curvplan_worker.curvature.trace import hutchpp_trace


class Flag:
    """``should_cancel`` that turns True once ``arm()`` was called; counts work after that."""

    def __init__(self) -> None:
        self.armed = False
        self.after = 0  # units of work done after the request

    def arm(self) -> None:
        self.armed = True

    def __call__(self) -> bool:
        return self.armed

    def work(self) -> None:
        if self.armed:
            self.after += 1


def counting_matvec(matrix: Tensor, flag: Flag, arm_at: int):
    calls = {"n": 0}

    def matvec(v: Tensor) -> Tensor:
        flag.work()
        calls["n"] += 1
        if calls["n"] == arm_at:
            flag.arm()
        return matrix @ v

    return matvec, calls


def spd(n: int, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return a @ a.T / n + torch.diag(torch.linspace(0.1, 10.0, n, dtype=torch.float64))


class CountingObjective:
    """RegressionObjective that counts forward evaluations and arms the flag at one of them."""

    def __init__(self, flag: Flag, arm_at: int) -> None:
        self.inner = RegressionObjective()
        self.flag = flag
        self.arm_at = arm_at
        self.calls = 0

    def output_losses(self, outputs: Tensor, targets: Tensor):
        """The engine's one objective protocol: every evaluation goes through here."""
        self.flag.work()
        self.calls += 1
        if self.calls == self.arm_at:
            self.flag.arm()
        return self.inner.output_losses(outputs, targets)

    def example_losses(self, model: nn.Module, inputs: Tensor, targets: Tensor):
        return self.output_losses(model(inputs), targets)


def mlp_and_data(n: int = 12) -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(n, 3, generator=g).double(), torch.randn(n, 2, generator=g).double()


def test_check_outside_a_scope_never_raises_and_the_scope_is_restored() -> None:
    check_cancel("anything")
    with cancel_scope(lambda: True):
        with pytest.raises(Cancelled):
            check_cancel("inside")
        with cancel_scope(None):
            check_cancel("nested scope without a check")
    check_cancel("after")


def test_lanczos_stops_within_one_product_of_the_request() -> None:
    flag = Flag()
    matvec, calls = counting_matvec(spd(80), flag, arm_at=5)
    with cancel_scope(flag), pytest.raises(Cancelled):
        lanczos_spectrum(matvec, 80, generator=torch.Generator().manual_seed(0), tol=1e-14)
    assert flag.after <= 1, calls
    # Without a scope the same run goes on to certify its ends (tens of products).
    flag2 = Flag()
    matvec2, calls2 = counting_matvec(spd(80), flag2, arm_at=5)
    lanczos_spectrum(matvec2, 80, generator=torch.Generator().manual_seed(0), tol=1e-8)
    assert calls2["n"] > 10


def test_hutchpp_stops_within_one_product_in_every_phase() -> None:
    for arm_at in (2, 12, 25):  # the sketch, the low-rank part, the Hutchinson part
        flag = Flag()
        matvec, calls = counting_matvec(spd(120), flag, arm_at=arm_at)
        with cancel_scope(flag), pytest.raises(Cancelled):
            hutchpp_trace(matvec, 120, n_products=30, generator=torch.Generator().manual_seed(0))
        assert flag.after <= 1, (arm_at, calls)
    flag = Flag()
    matvec, calls = counting_matvec(spd(20), flag, arm_at=3)  # exact trace: n products
    with cancel_scope(flag), pytest.raises(Cancelled):
        hutchpp_trace(matvec, 20, n_products=30, generator=torch.Generator().manual_seed(0))
    assert flag.after <= 1, calls


def test_per_example_losses_and_perturbed_losses_stop_within_one_micro_batch() -> None:
    model, x, y = mlp_and_data(12)
    flag = Flag()
    objective = CountingObjective(flag, arm_at=2)
    with cancel_scope(flag), pytest.raises(Cancelled):
        per_sample.per_example_losses(model, objective, x, y, batch_size=2)  # 6 micro-batches
    assert flag.after <= 1, objective.calls
    flag = Flag()
    objective = CountingObjective(flag, arm_at=3)
    with cancel_scope(flag), pytest.raises(Cancelled):
        per_sample.perturbed_losses(model, objective, x, y, 0.1, 4, batch_size=12)  # 4 dirs
    assert flag.after <= 1, objective.calls


def test_per_sample_hessian_norms_stop_inside_the_first_examples_lanczos() -> None:
    model, x, y = mlp_and_data(8)
    flag = Flag()
    objective = CountingObjective(flag, arm_at=1)  # armed by the first example's forward
    with cancel_scope(flag), pytest.raises(Cancelled):
        per_sample.per_sample_hessian_norms(model, objective, x, y, n_subsample=None, tol=1e-12)
    assert objective.calls == 1  # no second example was started


def test_gradient_noise_loops_stop_within_one_unit() -> None:
    model, x, y = mlp_and_data(12)
    # The chunk loop is the same for "vmap" (one forward per chunk) and "loop" (one per example).
    for chunk_size in (2, 12):
        flag = Flag()
        objective = CountingObjective(flag, arm_at=2)
        with cancel_scope(flag), pytest.raises(Cancelled):
            gn.per_example_gradients(model, objective, x, y, chunk_size=chunk_size, method="loop")
        assert flag.after <= 1, (chunk_size, objective.calls)
    flag = Flag()
    objective = CountingObjective(flag, arm_at=1)
    vectors = torch.eye(5, sum(p.numel() for p in model.parameters()), dtype=torch.float64)
    with cancel_scope(flag), pytest.raises(Cancelled):
        gn.hessian_quadratic_forms(model, objective, x, y, vectors, batch_size=3, n_groups=4)
    assert objective.calls == 1  # stopped among the first micro-batch's products


def test_analyze_stops_inside_the_first_block() -> None:
    """The whole engine: a cancel requested early in the (lockstep) block spectra ends the run
    before any block is certified."""
    spec = {
        "d_model": 8,
        "n_heads": 2,
        "d_ff": 16,
        "n_layers": 1,
        "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
    }
    from curvplan_worker.curvature.data import Dataset
    from curvplan_worker.curvature.model import build_model

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 11, (6, 7), generator=g)
    stages: list[str] = []
    checks = {"n": 0, "blocks_at": None}

    def progress(event) -> None:
        stages.append(event.message)
        if event.stage == "blocks" and checks["blocks_at"] is None:
            checks["blocks_at"] = checks["n"]

    def should_cancel() -> bool:
        checks["n"] += 1
        # True a few checks into the first block (well before its Lanczos can finish).
        return checks["blocks_at"] is not None and checks["n"] > checks["blocks_at"] + 3

    with pytest.raises(api.Cancelled):
        api.analyze(
            spec,
            None,
            None,
            {"precision": "float64", "dense": "off", "tolerance": 1e-10},
            progress=progress,
            should_cancel=should_cancel,
            machine=MachineSettings(self_test=False),
            model=build_model(spec, seed=1, dtype=torch.float64),
            data=Dataset(tokens[:, :-1], tokens[:, 1:]),
        )
    # the blocks run in lockstep: the cancel lands inside it, before any block is certified
    assert any("in lockstep" in m for m in stages), stages
    assert not [m for m in stages if m.startswith("block ")], stages
