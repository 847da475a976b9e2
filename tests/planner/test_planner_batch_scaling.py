"""The batch scaling law B_crit(D) = c·D^γ against generated ground truth: steps tables drawn
from S = S_min(1 + B_crit(D)/B) with B_crit(D) = c·D^γ known, plus noise."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from curvplan.types.planner import Measurements, Targets
from curvplan_core.planner import make_plan
from curvplan_core.planner.batch_scaling import (
    SweepTable,
    fit_batch_law,
    law_at,
    sweep_critical_batches,
)

C_TRUE, GAMMA_TRUE = 0.02, 0.45
BATCHES = [8, 16, 32, 64, 128, 256, 512, 1024, 2048]
TOKENS = [1e8, 3e8, 1e9]


def b_crit_true(tokens: float) -> float:
    return C_TRUE * tokens**GAMMA_TRUE


def steps_table(tokens: float, rng: np.random.Generator | None, noise: float = 0.05) -> list:
    """S = S_min(1 + B_crit(D)/B), S_min ∝ D/B_crit (more tokens: more steps), × lognormal."""
    bc = b_crit_true(tokens)
    s_min = tokens / bc / 100.0
    factor = np.ones(len(BATCHES)) if rng is None else np.exp(rng.normal(0, noise, len(BATCHES)))
    return [
        {"batch_size": b, "steps": float(s_min * (1 + bc / b) * f)}
        for b, f in zip(BATCHES, factor, strict=True)
    ]


def sweeps_body(rng: np.random.Generator | None, tokens: list[float] = TOKENS) -> list[dict]:
    return [{"tokens": d, "steps_to_target": steps_table(d, rng)} for d in tokens]


def plan(measurements: dict[str, Any], **targets: Any):
    return make_plan(
        Measurements.model_validate(measurements),
        Targets(bootstrap=100, orderings=8, **targets),
        seed=1,
    )


def test_the_law_recovers_c_and_gamma_and_its_intervals_cover_at_the_stated_rate() -> None:
    """A small coverage check: 40 generated pilot sets of 3 sweeps; γ, c and B_crit at 30×
    the largest pilot are covered at about the nominal 0.95 (≥ 0.85 of 40: a real failure
    rate of 0.80 passes with probability < 2 %)."""
    reps, covered, errors, widths = 40, np.zeros(3), [], []
    far = 30 * TOKENS[-1]
    for rep in range(reps):
        rng = np.random.default_rng(rep)
        tables = [SweepTable(d, BATCHES, [p["steps"] for p in steps_table(d, rng)]) for d in TOKENS]
        sweeps = sweep_critical_batches(tables, 0.95, bootstrap=50, seed=rep)
        law = fit_batch_law(sweeps, 0.95, seed=rep)
        assert not isinstance(law, str)
        _, (lo, hi) = law_at(law, far, seed=rep)
        covered += [
            law.gamma_ci[0] <= GAMMA_TRUE <= law.gamma_ci[1],
            law.c_ci[0] <= C_TRUE <= law.c_ci[1],
            lo <= b_crit_true(far) <= hi,
        ]
        errors.append(law.gamma - GAMMA_TRUE)
        widths.append(law.gamma_ci[1] - law.gamma_ci[0])
    rate = covered / reps
    assert np.all(rate >= 0.85), rate
    assert abs(float(np.median(errors))) < 0.03  # the fit is centred on the truth
    assert float(np.median(widths)) < 0.25  # and the intervals are informative


def test_two_exact_sweeps_give_the_line_through_their_critical_batches() -> None:
    """Oracle: with exact tables each sweep's B_crit is the truth, and two points fix the
    line: γ = log(B2/B1)/log(D2/D1), c = B1/D1^γ; the answer at any D is c·D^γ."""
    result = plan({"batch_sweeps": sweeps_body(None, [1e8, 1e9])}, target_tokens=5e9)
    law = result.budget.batch.scaling_law
    assert result.budget.batch.source == "batch_scaling_law"
    assert law is not None and law.c is not None
    assert law.gamma == pytest.approx(GAMMA_TRUE, rel=1e-4)
    assert law.c == pytest.approx(C_TRUE, rel=1e-3)
    assert result.budget.batch.critical == pytest.approx(b_crit_true(5e9), rel=1e-3)
    assert law.measured_tokens_range == (1e8, 1e9)
    assert law.extrapolation_factor == pytest.approx(5.0)
    assert all(s.used for s in law.sweeps)


def test_the_target_run_gets_the_laws_batch_and_a_warning_beyond_ten_times() -> None:
    rng = np.random.default_rng(7)
    measurements = {"batch_sweeps": sweeps_body(rng), "tokens_per_example": 512.0}
    near = plan(measurements, target_tokens=5 * TOKENS[-1])
    far = plan(measurements, target_tokens=30 * TOKENS[-1])
    for result, tokens in ((near, 5 * TOKENS[-1]), (far, 30 * TOKENS[-1])):
        batch = result.budget.batch
        assert batch.source == "batch_scaling_law"
        lo, hi = batch.critical_ci
        assert lo <= b_crit_true(tokens) <= hi
        assert batch.recommended == 2 ** round(math.log2(batch.critical))
        # the target run's steps: its tokens over the tokens of one step at that batch
        assert batch.expected_steps == pytest.approx(tokens / (batch.recommended * 512.0))
        assert batch.critical_tokens == pytest.approx(batch.critical * 512.0)
    assert not any("extrapolated beyond 10×" in w for w in near.budget.warnings)
    assert any("30× the largest pilot" in w for w in far.budget.warnings)
    # the further target is less certain
    width = lambda b: math.log(b.critical_ci[1] / b.critical_ci[0])  # noqa: E731
    assert width(far.budget.batch) > width(near.budget.batch)


def test_the_law_leads_only_for_a_target_run() -> None:
    """Without targets.target_tokens the pilots' own batch sweep answers; with it, the law."""
    rng = np.random.default_rng(3)
    measurements = {
        "batch_sweeps": sweeps_body(rng),
        "steps_to_target": steps_table(TOKENS[-1], rng),
    }
    assert plan(measurements).budget.batch.source == "batch_sweep"
    assert plan(measurements, target_tokens=1e10).budget.batch.source == "batch_scaling_law"
    no_sweeps = plan({"steps_to_target": steps_table(TOKENS[-1], rng)}, target_tokens=1e10)
    assert no_sweeps.budget.batch.source == "batch_sweep"
    assert any("batch_sweeps is not" in w for w in no_sweeps.budget.warnings)


def test_batch_sizes_in_tokens_give_the_same_law_in_examples() -> None:
    rng = np.random.default_rng(5)
    body = sweeps_body(rng)
    in_tokens = [
        {
            "tokens": s["tokens"],
            "steps_to_target": [
                {"batch_size": p["batch_size"] * 64, "steps": p["steps"]}
                for p in s["steps_to_target"]
            ],
        }
        for s in body
    ]
    examples = plan({"batch_sweeps": body, "tokens_per_example": 64.0}, target_tokens=1e10)
    tokens = plan(
        {"batch_sweeps": in_tokens, "tokens_per_example": 64.0, "steps_to_target_unit": "tokens"},
        target_tokens=1e10,
    )
    assert tokens.budget.batch.critical == pytest.approx(examples.budget.batch.critical, rel=1e-6)
    unknown = plan(
        {"batch_sweeps": in_tokens, "steps_to_target_unit": "tokens"}, target_tokens=1e10
    )
    assert unknown.budget.batch.source == "not_available"
    assert any("tokens_per_example is unknown" in w for w in unknown.budget.warnings)


def test_a_sweep_that_cannot_bound_b_crit_is_reported_and_left_out() -> None:
    """Steps that fall as 1/B (perfect linear scaling) do not bound B_crit: the sweep is
    listed as not used; with one usable sweep left there is no law, and it says why."""
    rng = np.random.default_rng(11)
    linear = [{"batch_size": b, "steps": 1e6 / b} for b in BATCHES]
    three = [*sweeps_body(rng), {"tokens": 3e9, "steps_to_target": linear}]
    result = plan({"batch_sweeps": three}, target_tokens=1e10)
    law = result.budget.batch.scaling_law
    assert law is not None
    dropped = [s for s in law.sweeps if not s.used]
    assert [s.tokens for s in dropped] == [3e9] and dropped[0].reason
    assert law.measured_tokens_range == (TOKENS[0], TOKENS[-1])
    two = [sweeps_body(rng)[0], {"tokens": 3e9, "steps_to_target": linear}]
    none = plan({"batch_sweeps": two}, target_tokens=1e10)
    assert none.budget.batch.source == "not_available"
    assert any("2 or more token counts; 1 usable" in w for w in none.budget.warnings)


GOOD_SWEEP = {
    "tokens": 1e9,
    "steps_to_target": [{"batch_size": b, "steps": 100.0} for b in (8, 16, 32)],
}


def _locs(body: dict, model: Any = Measurements) -> list[tuple]:
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    return [e["loc"] for e in err.value.errors()]


@pytest.mark.parametrize(
    ("sweeps", "loc"),
    [
        ([GOOD_SWEEP], ("batch_sweeps",)),  # one token count: no law
        ([GOOD_SWEEP, GOOD_SWEEP], ("batch_sweeps",)),  # the same token count twice
        ([GOOD_SWEEP, {**GOOD_SWEEP, "tokens": 0.0}], ("batch_sweeps", 1, "tokens")),
        ([GOOD_SWEEP, {**GOOD_SWEEP, "tokens": -5.0}], ("batch_sweeps", 1, "tokens")),
        ([GOOD_SWEEP, {**GOOD_SWEEP, "tokens": float("inf")}], ("batch_sweeps", 1, "tokens")),
        ([GOOD_SWEEP, {**GOOD_SWEEP, "tokens": 1e31}], ("batch_sweeps", 1, "tokens")),
        (
            [GOOD_SWEEP, {"tokens": 2e9, "steps_to_target": GOOD_SWEEP["steps_to_target"][:2]}],
            ("batch_sweeps", 1, "steps_to_target"),
        ),
        (
            [
                GOOD_SWEEP,
                {"tokens": 2e9, "steps_to_target": GOOD_SWEEP["steps_to_target"][:2] * 2},
            ],
            ("batch_sweeps", 1, "steps_to_target"),
        ),
        (
            [
                GOOD_SWEEP,
                {
                    "tokens": 2e9,
                    "steps_to_target": [
                        *GOOD_SWEEP["steps_to_target"][:2],
                        {"batch_size": 64, "steps": float("nan")},
                    ],
                },
            ],
            ("batch_sweeps", 1, "steps_to_target", 2, "steps"),
        ),
    ],
)
def test_bad_batch_sweeps_name_the_field(sweeps: list, loc: tuple) -> None:
    assert loc in _locs({"batch_sweeps": sweeps})


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), 1e31])
def test_bad_target_tokens_name_the_field(value: float) -> None:
    assert ("target_tokens",) in _locs({"target_tokens": value}, Targets)
