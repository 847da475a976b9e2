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
    assert [s.stage for s in est.stages] == ["blocks", "off_diagonal"]
    blocks, pairs = est.stages
    assert blocks.items == {"a": 65.0, "b": 65.0}
    assert blocks.seconds == pytest.approx(130 * 4.0 / 1000)
    assert pairs.products == 2 * 50.0 and pairs.worst_products == 2 * 300.0
    assert est.setup_seconds == pytest.approx(0.006)
    assert est.seconds == pytest.approx(0.006 + (130 + 100) * 0.004)
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
        "n_params": 20_000,
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
    assert record is not None and record["first_eta_seconds"] == first
    # The first ETA said 1.3 s; the run took 2.8 s after it.
    assert record["eta_relative_error"] == pytest.approx((1.3 - 2.8) / 2.8, abs=1e-4)  # 4 digits
    assert record["stages"][0]["items"] == {"a": 65.0, "b": 65.0}


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
