"""budget.data against a generated ground truth L(D) = E + A·D^(−β) (known E, A, β): a size
more than 1.5× outside the measured sizes is ``extrapolated`` with its interval open on that
side, and the next round halves or doubles toward the true size; next_step's cost counts
every run against an independent count (the sweep kind's own plan of the printed command)."""

from __future__ import annotations

import math
import shlex
import uuid

import pytest

from curvplan.types.jobs import SweepJobCreate
from curvplan.types.planner import Measurements, Targets
from curvplan_core import cost_model
from curvplan_core.planner import make_plan
from curvplan_core.planner.budget_section import data_sweep_next_step
from curvplan_core.planner.data_rounds import next_round

E, A, BETA = 1.0, 20.0, 0.5


def _target_for(d_star: float) -> float:
    return E + A * d_star**-BETA


def _measured(sizes: list[int]) -> Measurements:
    wobble = [1.0 + 1e-4 * math.sin(i) for i in range(len(sizes))]  # tiny, deterministic
    return Measurements(
        loss_vs_data=[
            {"n_samples": float(d), "loss": (E + A * d**-BETA) * w}
            for d, w in zip(sizes, wobble, strict=True)
        ],
        tokens_per_example=16.0,
        model_parameters=100_000,
    )


@pytest.mark.parametrize(
    ("d_star", "source"),
    [
        (4096 / 1.3, "data_sweep"),  # 1.3× below the smallest: inside the 1.5× band
        (4096 / 1.8, "extrapolated"),  # 1.8× below
        (32768 * 1.4, "data_sweep"),
        (32768 * 1.8, "extrapolated"),
    ],
)
def test_a_size_beyond_one_and_a_half_times_the_measured_sizes_is_flagged(
    d_star: float, source: str
) -> None:
    sizes = [4096, 8192, 16384, 32768]
    plan = make_plan(
        _measured(sizes),
        Targets(target_loss=_target_for(d_star), available_samples=200_000),
        seed=0,
    )
    data = plan.budget.data
    assert data.recommended_examples == pytest.approx(d_star, rel=0.02)
    assert data.source == source
    assert data.measured_sizes == (4096.0, 32768.0)
    flagged = [w for w in plan.budget.warnings if "extrapolated" in w]
    if source == "data_sweep":
        assert not flagged and data.next_step is None
        lo, hi = data.recommended_examples_ci
        assert lo is not None and hi is not None
        return
    assert flagged and "1.5×" in flagged[0]
    lo, hi = data.recommended_examples_ci
    below = d_star < 4096
    assert (lo is None) == below and (hi is None) == (not below)  # open on that side
    step = data.next_step
    assert step is not None and step.data_sizes
    # the next round brackets the truth: halvings of 4,096 down to one at or below D*, or
    # doublings of 32,768 up to one at or above it
    if below:
        assert step.next_round_sizes == [2048]
        assert min(step.next_round_sizes) <= d_star < 4096
        # the command's sweep fits on its own and trains no measured size again: the new
        # size and geometric midpoints between it and the smallest measured size
        assert step.data_sizes == [2048, 2435, 2896, 3444]
    else:
        assert step.next_round_sizes == [65536]
        assert max(step.next_round_sizes) >= d_star > 32768
        assert step.data_sizes == [38968, 46341, 55109, 65536]
    assert not set(step.data_sizes) & set(sizes)  # the analysis combines both sweeps' L(D)
    assert "--data-sizes " + ",".join(map(str, step.data_sizes)) in step.command
    assert "--sweep OLD --sweep NEW" in step.estimated_cost
    runs, examples = _independent_count(step.command)  # only the new runs are counted
    assert step.training_runs == runs == 4 * 3
    assert step.max_examples_processed == examples


def test_the_next_round_goes_as_far_as_the_true_size_within_its_cap() -> None:
    sizes = [4096, 8192, 16384, 32768]
    far = make_plan(_measured(sizes), Targets(target_loss=_target_for(300.0)), seed=0)
    assert far.budget.data.next_step.next_round_sizes == [512, 1024, 2048]  # 3 per round
    assert far.budget.data.next_step.data_sizes == [512, 1024, 2048, 2896]
    # no more training data above: nothing to run, and the reason says so
    short = make_plan(
        _measured(sizes),
        Targets(target_loss=_target_for(200_000.0), available_samples=32768),
        seed=0,
    ).budget.data
    assert short.source == "extrapolated" and short.next_step is None
    assert "more data is needed" in short.reason
    capped = next_round(sizes, [1.0] * 4, 0.5, 300.0, per_round=2)
    assert capped is not None and capped.sizes == [1024, 2048]
    # above, the training data's size caps the doublings (the whole set is the last size)
    above = next_round(sizes, [1.0] * 4, 0.5, 500_000.0, max_size=100_000)
    assert above is not None and above.sizes == [65536, 100_000]
    # without a fitted size the measured losses decide the side
    assert next_round(sizes, [2.0, 1.9, 1.8, 1.7], 1.5, None).sizes == [65536, 131072, 262144]
    assert next_round(sizes, [1.4, 1.3, 1.2, 1.1], 1.5, None, min_size=1024).sizes == [
        1024,
        2048,
    ]
    assert next_round(sizes, [1.6, 1.55, 1.45, 1.4], 1.5, None) is None  # bracketed


def _independent_count(command: str) -> tuple[int, int]:
    """Runs and examples of the printed command, counted from the sweep kind's own plan."""
    from curvplan_worker.kinds.sweep import plan_points

    argv = shlex.split(command)
    sizes = [int(x) for x in argv[argv.index("--data-sizes") + 1].split(",")]
    settings = {
        "type": "data",
        "data_sizes": sizes,
        "batch_size": int(argv[argv.index("--batch-size") + 1]),
        "target_loss": float(argv[argv.index("--target-loss") + 1]),
    }
    body = SweepJobCreate.model_validate(
        {
            "kind": "sweep",
            "model": {
                "d_model": 8,
                "n_heads": 2,
                "d_ff": 16,
                "n_layers": 1,
                "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
            },
            "train_data": str(uuid.uuid4()),
            "eval_data": str(uuid.uuid4()),
            "sweep": settings,
        }
    )
    points = [c.request.point for c in plan_points(body, n_train=max(sizes))]
    return len(points), sum(p.max_steps * p.batch_size for p in points)


def test_next_step_counts_every_run_of_the_lr_grid_and_prices_them() -> None:
    available = 108_320  # the run: 6 sizes from 108,320 down to 3,385
    step = data_sweep_next_step(1.5, available, 64.0, model_parameters=2_000_000)
    runs, examples = _independent_count(step.command)
    assert step.training_runs == runs == 18  # 6 sizes × 3 lr-grid multipliers
    assert step.max_examples_processed == examples
    # by hand: 10 epochs of each size at batch 32, at least 200 steps, 3 runs each
    by_hand = 3 * 32 * sum(max(200, math.ceil(10 * d / 32)) for d in step.data_sizes)
    assert examples == by_hand
    assert step.estimated_seconds == pytest.approx(6 * 2_000_000 * 64.0 * examples / 2.0e10)
    assert "18 training runs" in step.estimated_cost
    assert cost_model.format_duration(step.estimated_seconds) in step.estimated_cost
    assert "at most 3 rounds and 36 runs" in step.estimated_cost
