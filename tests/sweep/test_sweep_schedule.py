"""The data sweep's learning-rate schedules against their closed forms, step by step."""

from __future__ import annotations

import math

import pytest

from curvplan_worker.sweep.lr import interpolated_multiplier, lr_at_step

PEAK, T, W = 0.01, 200, 10


def test_warmup_is_linear_from_the_first_step_for_every_schedule() -> None:
    for schedule in ("constant", "cosine", "wsd"):
        for t in range(W):
            lr = lr_at_step(t, PEAK, T, warmup_steps=W, schedule=schedule)  # type: ignore[arg-type]
            assert lr == pytest.approx(PEAK * (t + 1) / W)


def test_cosine_matches_half_a_cosine_from_the_peak_to_zero() -> None:
    lrs = [lr_at_step(t, PEAK, T, warmup_steps=W, schedule="cosine") for t in range(T)]
    for t in range(W, T):
        expected = PEAK * 0.5 * (1 + math.cos(math.pi * (t + 1 - W) / (T - W)))
        assert lrs[t] == pytest.approx(expected, abs=1e-15)
    assert lrs[-1] == pytest.approx(0.0, abs=1e-15)
    assert all(a >= b for a, b in zip(lrs[W:], lrs[W + 1 :], strict=False))  # decays


def test_wsd_is_constant_then_cools_down_as_one_minus_sqrt() -> None:
    c = 0.25
    cooldown = math.ceil(c * T)  # 50 steps
    start = T - cooldown
    for t in range(T):
        lr = lr_at_step(t, PEAK, T, warmup_steps=W, schedule="wsd", cooldown_fraction=c)
        if t < W:
            continue
        if t + 1 <= start:
            assert lr == PEAK
        else:
            assert lr == pytest.approx(PEAK * (1 - math.sqrt((t + 1 - start) / cooldown)))
    assert lr_at_step(T - 1, PEAK, T, schedule="wsd", cooldown_fraction=c) == 0.0
    assert lr_at_step(start, PEAK, T, schedule="wsd", cooldown_fraction=c) == pytest.approx(
        PEAK * (1 - math.sqrt(1 / cooldown))
    )


def test_the_interpolated_multiplier_is_log_linear_in_log_d() -> None:
    assert interpolated_multiplier((100, 10_000), (0.5, 2.0), 1000) == pytest.approx(1.0)
    assert interpolated_multiplier((100, 10_000), (0.5, 2.0), 100) == pytest.approx(0.5)
    assert interpolated_multiplier((100, 10_000), (0.5, 2.0), 10_000) == pytest.approx(2.0)
