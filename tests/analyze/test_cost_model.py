"""The torch-free cost model, the worker's ETA and its time admission, the CLI's ETA line."""

from __future__ import annotations

import io
import math
import time
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from curvplan.client import display
from curvplan.client import models as m
from curvplan.types.options import AnalysisOptions
from curvplan_core import cost_model
from curvplan_worker.analyze.eta import EtaTracker
from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.errors import JobError

OPTS = {"tolerance": 1e-3, "max_iter": 300, "trace_probes": 15, "precision": "float32"}
#: The options of the ETA tests' analyses: their spectra alone.
SPECTRA_ONLY = AnalysisOptions(**OPTS, per_sample=False, gradient_noise=False, dense="off")


@pytest.fixture(autouse=True)
def _a_prior_of_50_steps_at_1e_3(monkeypatch: pytest.MonkeyPatch) -> None:
    """The arithmetic below is written for a prior of 20 + 10·3 = 50 Lanczos steps a block at
    tolerance 1e-3 and 40 a per-example Hessian norm; they are pinned here so that a
    recalibration of the priors (measured constants, ``cost_model.STEPS_BASE`` and
    ``PER_SAMPLE_STEPS``) does not rewrite the tests of the mechanics."""
    monkeypatch.setattr(cost_model, "STEPS_BASE", 20.0)
    monkeypatch.setattr(cost_model, "PER_SAMPLE_STEPS", 40)


def test_block_products_follow_the_engines_counts() -> None:
    opts = cost_model.CostOptions.from_options(OPTS)
    # 20 + 10·log10(1e3) = 50 Lanczos steps, plus the trace probes.
    assert cost_model.block_products(10_000, opts) == (50.0 + 15, 300.0 + 15)
    # A block smaller than max_iter and the probes: the Krylov space and the exact trace.
    assert cost_model.block_products(12, opts) == (12.0 + 12, 12.0 + 12)
    ggn = cost_model.CostOptions.from_options({**OPTS, "ggn": True})
    assert cost_model.block_products(10_000, ggn) == (3 * 50.0 + 15, 3 * 300.0 + 15)
    # float32 cannot certify 1e-6: the prior is max_iter.
    strict32 = cost_model.CostOptions.from_options({**OPTS, "tolerance": 1e-6})
    assert cost_model.expected_lanczos_steps(10_000, strict32) == 300.0
    strict64 = cost_model.CostOptions.from_options(
        {**OPTS, "tolerance": 1e-6, "precision": "float64"}
    )
    assert cost_model.expected_lanczos_steps(10_000, strict64) == 80.0


def test_the_estimate_is_products_times_milliseconds_stage_by_stage() -> None:
    est = cost_model.estimate(
        blocks={"a": 10_000, "b": 500},
        pairs=[("a", "b", 10_000, 500)],
        n_params=10_500,
        n_examples=64,
        tokens=64 * 32,
        options={**OPTS, "dense": "off", "per_sample": False, "gradient_noise": False},
        ms_per_product=4.0,
        first_product_ms=10.0,
    )
    assert [s.stage for s in est.stages] == ["blocks", "off_diagonal", "full_model"]
    blocks, pairs, full = est.stages
    assert blocks.items == {"a": 65.0, "b": 65.0}
    assert blocks.seconds == pytest.approx(130 * 4.0 / 1000)
    assert pairs.products == 2 * 50.0 and pairs.worst_products == 2 * 300.0
    assert full.products == 0.5 * 50 and full.worst_products == 300  # λ_max alone
    assert est.setup_seconds == pytest.approx(0.006)
    assert est.seconds == pytest.approx(0.006 + (130 + 100 + 25) * 0.004)
    assert est.worst_seconds > est.seconds
    assert est.ms_source == "measured"
    # Without a measurement: the FLOPs prior, 12·P·T at 2e10 FLOP/s.
    prior = cost_model.estimate(
        blocks={"a": 10}, pairs=[], n_params=1000, n_examples=10, tokens=100, options=OPTS
    )
    assert prior.ms_per_product == pytest.approx(1000 * 12 * 1000 * 100 / 2e10)
    assert prior.ms_source.startswith("prior")


def _event(stage: str, products: int, block: str | None = None, cost=None) -> SimpleNamespace:
    return SimpleNamespace(stage=stage, products=products, block=block, cost=cost)


def _inputs(**extra) -> dict:
    return {
        "ms_per_product": 10.0,
        "first_product_ms": 10.0,
        "blocks": {"a": 10_000, "b": 10_000},
        "pairs": [],
        "n_params": 2_000_000,  # no whole-model λ_max: its float64 basis would pass 4 GiB
        "n_examples": 8,
        "tokens": 64,
        "options": SPECTRA_ONLY.model_dump(mode="json"),  # the engine's record of them
        "stages": None,
        **extra,
    }


def test_the_eta_counts_down_as_lockstep_certifies_blocks() -> None:
    """Lockstep spectra (docs/numerics.md#lockstep): every block runs in the ``blocks`` stage
    at once and a ``blocks`` event naming a block says it is certified."""
    clock = [100.0]
    eta = EtaTracker(None, SPECTRA_ONLY, clock=lambda: clock[0])
    assert eta.update(_event("load", 0)) is None  # no estimate yet
    first = eta.update(_event("cost", 0, cost=_inputs()))
    assert first == pytest.approx(2 * 65 * 0.010)  # two blocks of 65 products, 10 ms each
    eta.update(_event("blocks", 0))  # "0/2 certified": the lockstep starts
    # 100 products at 20 ms each, none certified: 30 of the 130 prior products are left, at
    # the 20 ms seen.
    clock[0] += 100 * 0.020
    assert eta.update(_event("blocks", 100)) == pytest.approx(30 * 0.020)
    # a certified after 120 products: 10 of the 130 prior products are left.
    clock[0] += 20 * 0.020
    assert eta.update(_event("blocks", 120, block="a")) == pytest.approx(10 * 0.020)
    clock[0] += 20 * 0.020
    assert eta.update(_event("blocks", 140, block="b")) == 0.0  # both certified
    assert eta.update(_event("done", 140)) == 0.0
    record = eta.record()
    assert record is not None and record.first_eta_seconds == first
    # The first ETA said 1.3 s; the run took 2.8 s after it.
    assert record.eta_relative_error == pytest.approx((1.3 - 2.8) / 2.8, abs=1e-4)  # 4 digits
    assert record.stages[0].items == {"a": 65.0, "b": 65.0}


def test_a_certified_pair_counts_in_the_lockstep_spectra() -> None:
    """Pairs (``row|col``) run inside the blocks stage: a certified pair is no KeyError, and
    the off-diagonal stage is not counted again after the blocks."""
    eta = EtaTracker(None, SPECTRA_ONLY, clock=lambda: 0.0)
    first = eta.update(_event("cost", 0, cost=_inputs(pairs=[["a", "b", 10_000, 10_000]])))
    assert first is not None and first > 2 * 65 * 0.010  # the pair's products are counted
    eta.update(_event("blocks", 0))
    after_pair = eta.update(_event("blocks", 0, block="a|b"))
    assert after_pair == pytest.approx(first)  # counted once, in the blocks stage


def test_an_estimate_past_the_time_left_fails_at_once_naming_it() -> None:
    limits = AttemptLimits(time_limit_seconds=1.0, started_at=time.monotonic())
    eta = EtaTracker(limits, SPECTRA_ONLY)
    with pytest.raises(JobError) as caught:
        eta.update(_event("cost", 0, cost=_inputs(ms_per_product=1000.0)))
    assert caught.value.type == "over-time-limit"
    assert "130 products × 1000.0 ms per product" in caught.value.detail
    assert "max_iter" in caught.value.detail and "tolerance" in caught.value.detail
    # Within the limit it passes.
    EtaTracker(AttemptLimits(time_limit_seconds=3600.0), SPECTRA_ONLY).update(
        _event("cost", 0, cost=_inputs())
    )


def test_the_estimate_reads_the_typed_options_not_the_events_record() -> None:
    """The worker's admission at the first step estimates with the validated request's
    options (the tracker's), whatever the engine's event carries as its record."""
    typed = SPECTRA_ONLY.model_copy(update={"trace_probes": 0})
    eta = EtaTracker(None, typed, clock=lambda: 0.0)
    first = eta.update(_event("cost", 0, cost=_inputs()))  # the record says 15 probes
    assert first == pytest.approx(2 * 50 * 0.010)  # 50 Lanczos steps per block, no probes
    assert eta.update(_event("cost", 0, cost=_inputs(options=None))) == pytest.approx(first)


def _job(eta: float | None, status: str = "running") -> m.JobOut:
    now = datetime.now(UTC)
    return m.JobOut.model_validate(
        {
            "id": str(uuid.uuid4()),
            "kind": "analyze",
            "queue": "gpu",
            "status": status,
            "name": None,
            "tags": {},
            "progress": {"fraction": 0.3, "stage": "block spectra 2/9", "eta_seconds": eta},
            "attempt": 1,
            "max_attempts": 3,
            "cancel_requested": False,
            "result": None,
            "error": None,
            "created_at": now,
            "updated_at": now,
            "started_at": now,
            "finished_at": None,
            "links": {"self": "/x", "cancel": "/x", "recommendation": "/x"},
        }
    )


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(42.0, "≈ 42 s left"), (185.0, "≈ 3 min left"), (3 * 3600.0, "≈ 3.0 h left"), (None, "")],
)
def test_the_wait_line_prints_the_eta(seconds, words) -> None:
    assert display.time_left(seconds) == words
    out = io.StringIO()
    display.ProgressDisplay(out, tty=False)(_job(seconds))
    line = out.getvalue()
    assert "block spectra 2/9" in line
    assert (words in line) if words else "left" not in line
    assert display.time_left(math.nan) == ""


# ------------------------------------------------------------------ the spectra as they run
NO_LATER = {**OPTS, "dense": "off", "per_sample": False, "gradient_noise": False}


def test_the_loop_spectra_price_each_block_at_its_own_product() -> None:
    """One product per vector (the CPU loop path): block i's 50 Lanczos steps and 15 trace
    probes at its own measured ms, a pair's 2 · 50 products at the mean of its two
    directions; the one measured product (ms_per_product) prices only the other stages."""
    timing = {"item_ms": {"a": 30.0, "b": 2.0, "a|b": 7.0}, "batched": False}
    est = cost_model.estimate(
        blocks={"a": 10_000, "b": 10_000},
        pairs=[("a", "b", 10_000, 10_000)],
        n_params=20_000,
        n_examples=64,
        tokens=64 * 32,
        options=NO_LATER,
        ms_per_product=50.0,
        spectra=timing,
    )
    blocks, pairs = est.stage("blocks"), est.stage("off_diagonal")
    assert blocks is not None and pairs is not None
    assert blocks.item_seconds == pytest.approx({"a": 65 * 0.030, "b": 65 * 0.002})
    assert blocks.seconds == pytest.approx(65 * 0.032)
    assert blocks.ms_per_product == pytest.approx(16.0)  # (30 + 2) / 2: the blocks' mean
    assert pairs.seconds == pytest.approx(100 * 0.007)
    full = est.stage("full_model")  # 0.5 · 50 steps at the measured product
    assert full is not None and full.seconds == pytest.approx(25 * 0.050)
    assert est.seconds == pytest.approx(65 * 0.032 + 100 * 0.007 + 25 * 0.050)
    # The iteration's own cost adds to each Lanczos product (50 of a's 65; 100 of the pair's),
    # not to the trace probes.
    stepped = cost_model.estimate(
        blocks={"a": 10_000},
        pairs=[("a", "b", 10_000, 10_000)],
        n_params=20_000,
        n_examples=64,
        tokens=64,
        options=NO_LATER,
        ms_per_product=50.0,
        spectra={**timing, "step_ms": {"a": 2.0, "a|b": 1.0}},
    )
    assert stepped.stage("blocks").seconds == pytest.approx(  # type: ignore[union-attr]
        (65 * 30 + 50 * 2) / 1000
    )
    assert stepped.stage("off_diagonal").seconds == pytest.approx(  # type: ignore[union-attr]
        100 * (7 + 1) / 1000
    )
    # A block the timing does not name falls back to the measured product.
    partial = cost_model.estimate(
        blocks={"a": 10_000, "c": 10_000},
        pairs=[],
        n_params=20_000,
        n_examples=64,
        tokens=64,
        options=NO_LATER,
        ms_per_product=50.0,
        spectra=timing,
    )
    assert partial.stage("blocks").item_seconds == pytest.approx(  # type: ignore[union-attr]
        {"a": 65 * 0.030, "c": 65 * 0.050}
    )


def test_batched_rounds_cost_fixed_plus_per_vector_while_items_drop_out() -> None:
    """Closed form: the round cost is the line through the 1-vector (12 ms) and the 4-vector
    (30 ms) products: 6 ms fixed + 6 ms a vector. Items of 10, 20 and 40 rounds, 2 vectors
    a backward: 10 rounds of 3 running (2 backwards: 2·6 + 3·6 = 30 ms), 10 of 2 (one
    backward: 6 + 2·6 = 18 ms), 20 of 1 (6 + 6 = 12 ms), each round's cost shared by the
    items running."""
    timing = cost_model.SpectraTiming(
        batched=True, vectors_per_product=2, round_ms=30.0, round_vectors=4, one_vector_ms=12.0
    )
    assert timing.round_cost() == pytest.approx((6.0, 6.0))
    got = cost_model.lockstep_item_seconds({"x": 10, "y": 20, "z": 40}, timing)
    x = 10 * 30 / 3
    y = x + 10 * 18 / 2
    z = y + 20 * 12
    assert got == pytest.approx({"x": x / 1000, "y": y / 1000, "z": z / 1000})
    assert sum(got.values()) == pytest.approx((10 * 30 + 10 * 18 + 20 * 12) / 1000)
    # At most 2 running: z starts when x is done (round 10), so rounds 10..20 run y and z
    # (18 ms, 9 each), then z alone for its last 30 rounds (12 ms).
    two = cost_model.lockstep_item_seconds(
        {"x": 10, "y": 20, "z": 40},
        cost_model.SpectraTiming(**{**timing.as_dict(), "concurrent": 2}),
    )
    assert two == pytest.approx(
        {"x": 10 * 18 / 2 / 1000, "y": 20 * 18 / 2 / 1000, "z": (10 * 9 + 30 * 12) / 1000}
    )


def test_the_batched_estimate_prices_lanczos_in_rounds_and_traces_alone() -> None:
    """Two blocks of 50 Lanczos steps in lockstep (one backward of both vectors, 4 ms fixed +
    1 ms a vector: 50 rounds × 6 ms, 3 ms each a round), then each block's 15 trace probes
    one at a time at its own product."""
    timing = {
        "item_ms": {"a": 10.0, "b": 20.0},
        "batched": True,
        "vectors_per_product": 32,
        "round_ms": 6.0,
        "round_vectors": 2,
        "one_vector_ms": 5.0,
    }
    est = cost_model.estimate(
        blocks={"a": 10_000, "b": 10_000},
        pairs=[],
        n_params=20_000,
        n_examples=64,
        tokens=64,
        options=NO_LATER,
        ms_per_product=8.0,
        spectra=timing,
        stages=["blocks"],
    )
    blocks = est.stage("blocks")
    assert blocks is not None
    assert blocks.item_seconds == pytest.approx(
        {"a": (50 * 3 + 15 * 10) / 1000, "b": (50 * 3 + 15 * 20) / 1000}
    )
    assert est.seconds == pytest.approx((50 * 6 + 15 * 30) / 1000)


def test_the_first_eta_and_its_countdown_use_the_spectra_pricing() -> None:
    """The first ETA is the spectra as timed (not the one product × every product); while
    they run, the pace seen against that prior scales what is left and the later stages."""
    clock = [0.0]
    options = {**OPTS, "per_sample": False, "dense": "off"}  # gradient noise after the spectra
    # the tracker estimates with the request's typed options (not the event's copy)
    eta = EtaTracker(None, AnalysisOptions(**options), clock=lambda: clock[0])
    timing = {"item_ms": {"a": 30.0, "b": 2.0}, "batched": False}
    inputs = _inputs(spectra=timing, options=options, n_params=20_000)
    first = eta.update(_event("cost", 0, cost=inputs))
    est = eta.estimate
    assert est is not None
    noise = est.stage("gradient_noise")
    full = est.stage("full_model")
    assert noise is not None and full is not None
    spectra = 65 * (0.030 + 0.002)  # 2.08 s, where 130 products × 10 ms would say 1.3 s
    assert first == pytest.approx(spectra + full.seconds + noise.seconds, abs=0.05)
    eta.update(_event("blocks", 0))
    # 65 products in 2.08 s: twice the prior's 16 ms mean, so 65 products are left at 32 ms
    # and the later stages take twice their estimate.
    clock[0] += 65 * 0.032
    left = eta.update(_event("blocks", 65))
    assert left == pytest.approx(65 * 0.032 + 2 * (full.seconds + noise.seconds), abs=0.05)
    record = eta.record()
    assert record is not None and record.measured is not None
    assert record.measured.model_dump(exclude_unset=True)["spectra"] == timing


def test_depth_weights_rank_blocks_from_the_input_and_keep_the_total() -> None:
    """Three blocks in forward order: raw weights 3/3, 2/3, 1/3; the pair (a, c) the larger,
    1. Scaled so that Σ products · weight = Σ products."""
    products = {"a": 10.0, "b": 10.0, "c": 10.0, "a|c": 20.0}
    got = cost_model.depth_weights(products, [("a", "c", 5, 5)])
    # Σ products·raw = 10 + 10·2/3 + 10/3 + 20 = 40 against Σ products = 50
    scale = 50 / 40
    assert got == pytest.approx({"a": scale, "b": scale * 2 / 3, "c": scale / 3, "a|c": scale})
    assert sum(products[k] * w for k, w in got.items()) == pytest.approx(sum(products.values()))


def test_the_per_sample_norms_are_priced_from_one_timed_example() -> None:
    """8 examples × (the first product 20 ms + 39 warm ones at 5 ms + 40 Lanczos steps at
    2 ms) = 8 · 295 ms, plus the 9 forwards at a third of the measured product."""
    options = {**OPTS, "dense": "off", "gradient_noise": False, "hessian_subsample": 8}
    est = cost_model.estimate(
        blocks={},
        pairs=[],
        n_params=2_000_000,
        n_examples=64,
        tokens=64,
        options=options,
        ms_per_product=30.0,
        example={"first_ms": 20.0, "warm_ms": 5.0, "step_ms": 2.0},
    )
    per_sample = est.stage("per_sample")
    assert per_sample is not None
    assert per_sample.seconds == pytest.approx(8 * (20 + 39 * 5 + 40 * 2) / 1000 + 9 / 3 * 0.030)
    untimed = cost_model.estimate(
        blocks={},
        pairs=[],
        n_params=2_000_000,
        n_examples=64,
        tokens=64,
        options=options,
        ms_per_product=30.0,
    ).stage("per_sample")
    assert untimed is not None and untimed.seconds == pytest.approx(untimed.products * 0.030)
