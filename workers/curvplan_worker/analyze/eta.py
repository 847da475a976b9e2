"""The ETA of a running analysis and its time admission (docs/operations.md#cost-model-and-eta).

The engine measures one product before the spectra and reports the figures as its ``cost``
event (``curvplan_worker.curvature.limits``). :class:`EtaTracker` turns them into a stage-by-
stage estimate with the torch-free cost model (``curvplan_core.cost_model``), fails the job
at once with ``over-time-limit`` when the estimate exceeds the time the worker allows, and then
gives every progress report an ``eta_seconds``: the stages not yet run at the measured speed,
plus what is left of the current one, refined as the spectra go (the prior products the stage
has not yet made, and the milliseconds per product actually seen). The spectra are priced as
they run (``cost_model.SpectraTiming``: each block's own warm product, and the batched
lockstep rounds where the plan batches); while they run, the pace they show against that
prior scales the later stages too.

The spectra run in lockstep (``curvature/lockstep.py``): every block and off-diagonal pair
advances in the ``blocks`` stage at once, and a ``blocks`` event naming a ``block`` (a block
name, or ``row|col`` for a pair) says that its Lanczos is certified; its trace runs after. The
products one item took are not separable, so the stage's prior products count down as a
whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from curvplan.types.options import AnalysisOptions
from curvplan.types.results import AttemptLimitsRecord, CostEstimate, MeasuredCost
from curvplan_core import cost_model
from curvplan_worker.curvature.limits import AttemptLimits
from curvplan_worker.errors import JobError

if TYPE_CHECKING:
    from curvplan_worker.curvature.analyze import ProgressEvent

#: Engine stages in the order ``analyze`` runs them (``curvature.analyze.ProgressEvent``).
ORDER = (
    "blocks",
    "off_diagonal",
    "full_model",
    "dense",
    "top_eigenspace",
    "per_sample",
    "gradient_noise",
)


class EtaTracker:
    """Wraps the engine's progress callback: estimate at the ``cost`` event, ETA after it."""

    def __init__(
        self,
        limits: AttemptLimits | None,
        options: AnalysisOptions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.options = options
        self.clock = clock
        self.estimate: cost_model.CostEstimate | None = None
        self.inputs: dict[str, Any] | None = None
        self.stage: str | None = None
        self.stage_started = clock()
        self.stage_products_at_start = 0
        self.stage_seconds: dict[str, float] = {}
        self.first_eta: float | None = None
        self.first_eta_at: float | None = None
        self.last_eta: float | None = None

    # ----------------------------------------------------------------------- events
    def update(self, event: ProgressEvent) -> float | None:
        """Take one engine event; the ETA in seconds after it (None before the estimate)."""
        now = self.clock()
        products = event.products
        if event.stage == "cost" and event.cost:
            self._start(event.cost)
        if event.stage != self.stage:
            if self.stage is not None:
                self.stage_seconds[self.stage] = (
                    self.stage_seconds.get(self.stage, 0.0) + now - self.stage_started
                )
            self.stage, self.stage_started = event.stage, now
            self.stage_products_at_start = products or 0
        if self.estimate is None:
            return None
        eta = self._eta(event, now, products)
        if self.first_eta is None:
            self.first_eta, self.first_eta_at = eta, now
        self.last_eta = eta
        return eta

    def _start(self, inputs: dict[str, Any]) -> None:
        """Estimate from the engine's measured figures and admit (or refuse) the attempt. The
        options are the tracker's: the validated request's, which the engine ran with."""
        self.inputs = inputs
        self.estimate = cost_model.estimate(
            blocks=inputs.get("blocks") or {},
            pairs=inputs.get("pairs") or [],
            n_params=int(inputs["n_params"]),
            n_examples=int(inputs["n_examples"]),
            tokens=float(inputs.get("tokens") or inputs["n_examples"]),
            options=self.options,  # the create model's, typed (the event's copy is a record)
            ms_per_product=inputs.get("ms_per_product"),
            first_product_ms=inputs.get("first_product_ms"),
            stages=inputs.get("stages"),
            spectra=inputs.get("spectra"),
            example=inputs.get("example"),
        )
        self._admit(self.estimate)

    def _admit(self, estimate: cost_model.CostEstimate) -> None:
        left = self.limits.seconds_left() if self.limits is not None else None
        if left is None or estimate.seconds <= left:
            return
        limit = self.limits.time_limit_seconds if self.limits is not None else None
        raise JobError(
            "over-time-limit",
            "The analysis would run past its time limit",
            f"estimated {estimate.seconds:.0f} s ({cost_model.describe(estimate)}) but "
            f"{max(left, 0):.0f} s of the {limit:g} s limit are left "
            f"(CURVPLAN_JOB_TIME_LIMITS). Shorten it with {cost_model.TIME_OPTIONS}",
        )

    # ----------------------------------------------------------------------- the ETA
    def _prior_ms(self, stage: str) -> float:
        """The estimate's milliseconds per product of ``stage`` (the lockstep spectra: the
        blocks' and pairs' together), else the one measured product's."""
        assert self.estimate is not None
        names = ("blocks", "off_diagonal") if stage in ("blocks", "off_diagonal") else (stage,)
        costs = [c for n in names if (c := self.estimate.stage(n)) is not None]
        products = sum(c.products for c in costs)
        if products > 0:
            return 1000.0 * sum(c.seconds for c in costs) / products
        return self.estimate.ms_per_product

    def _ms(self, stage: str, now: float, products: int | None) -> tuple[float, float]:
        """(milliseconds per product this stage shows so far, else its prior; the prior)."""
        assert self.estimate is not None
        prior = self._prior_ms(stage)
        done = (products or 0) - self.stage_products_at_start
        elapsed = now - self.stage_started
        if stage in ("blocks", "off_diagonal", "dense") and done >= 5 and elapsed > 0:
            return 1000.0 * elapsed / done, prior
        return prior, prior

    def _spectra_items(self) -> dict[str, float]:
        """Prior products of every block and pair the lockstep spectra run."""
        assert self.estimate is not None
        items: dict[str, float] = {}
        for name in ("blocks", "off_diagonal"):
            stage = self.estimate.stage(name)
            if stage is not None and stage.items:
                items.update(stage.items)
        return items

    def _blocks_left(self, ms: float, products: int | None) -> float:
        """Seconds left in the lockstep spectra: the prior products of every block and pair
        (Lanczos, then trace and GGN parts) less the products the stage has made. A certified
        item still has its trace to run, so certification alone does not drop its prior."""
        items = self._spectra_items()
        done = max((products or 0) - self.stage_products_at_start, 0)
        return max(sum(items.values()) - done, 0.0) * ms / 1000.0

    def _eta(self, event: ProgressEvent, now: float, products: int | None) -> float:
        assert self.estimate is not None
        current = event.stage
        if current in ("bounds", "done"):
            return 0.0
        ms, prior = self._ms(current, now, products)
        scale = ms / prior if prior > 0 else 1.0  # the stage's pace against its prior
        later = ORDER[ORDER.index(current) + 1 :] if current in ORDER else ORDER
        if current == "blocks":  # the pairs run inside the blocks stage (lockstep)
            later = tuple(s for s in later if s != "off_diagonal")
        total = sum(
            cost.seconds * scale for s in later if (cost := self.estimate.stage(s)) is not None
        )
        if current == "blocks":
            total += self._blocks_left(ms, products)
        elif (cost := self.estimate.stage(current)) is not None:
            total += max(cost.seconds * scale - (now - self.stage_started), 0.0)
        return round(total, 1)

    # ----------------------------------------------------------------------- the record
    def record(self, elapsed: float | None = None) -> CostEstimate | None:
        """The estimate, the measured inputs and how the first ETA compared with the run."""
        if self.estimate is None:
            return None
        out = CostEstimate.model_validate(self.estimate.as_dict())
        if self.inputs is not None:
            out.measured = MeasuredCost.model_validate(
                {
                    k: self.inputs.get(k)
                    for k in (
                        "ms_per_product",
                        "first_product_ms",
                        "memory",
                        "micro_batch",
                        "spectra",
                        "example",
                    )
                    if k in self.inputs
                }
            )
        out.stage_seconds = {k: round(v, 3) for k, v in self.stage_seconds.items()}
        if self.first_eta is not None and self.first_eta_at is not None:
            actual = self.clock() - self.first_eta_at
            out.first_eta_seconds = self.first_eta
            out.actual_seconds_after_first_eta = round(actual, 3)
            if actual > 0:
                out.eta_relative_error = round((self.first_eta - actual) / actual, 4)
        if self.limits is not None:
            out.limits = AttemptLimitsRecord.model_validate(self.limits.as_dict())
        return out
