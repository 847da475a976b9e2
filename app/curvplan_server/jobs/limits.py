"""How much planner work one plan job may ask for, checked when it is submitted.

The planner's cost is (N + P·N) × orderings loss evaluations for the Δ_k curves plus the
bootstrap draws of its fits; a plan within the contract's absolute caps could still hold a
CPU worker for its whole time limit (200,000 losses × 1,000 orderings × 100,000 draws did).
The operator's settings bound both; more is a 422 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from curvplan.types.jobs import JobCreateModel, PlanJobCreate
from curvplan.types.problems import FieldErrorEntry
from curvplan_core.config import Settings
from curvplan_server.problems import validation_problem


@dataclass(frozen=True)
class PlanLimits:
    max_loss_evaluations: int
    max_bootstrap: int

    @classmethod
    def from_settings(cls, settings: Settings) -> PlanLimits:
        return cls(settings.plan_max_loss_evaluations, settings.plan_max_bootstrap)


def check_plan_work(body: JobCreateModel, limits: PlanLimits) -> None:
    """422 naming ``body.targets.orderings`` / ``body.targets.bootstrap`` past the limits."""
    if not isinstance(body, PlanJobCreate):
        return
    measurements, targets = body.measurements, body.targets
    n = len(measurements.per_sample_losses or []) if measurements is not None else 0
    perturbed = measurements.perturbed_losses if measurements is not None else None
    rows = perturbed.losses if perturbed is not None else []
    losses = n + (len(rows) * len(rows[0]) if rows else 0)
    orderings, bootstrap = targets.orderings, targets.bootstrap
    errors: list[FieldErrorEntry] = []
    if losses * orderings > limits.max_loss_evaluations:
        allowed = limits.max_loss_evaluations // max(1, losses)
        hint = (
            f"use at most {allowed} orderings"
            if allowed >= 2
            else "subsample measurements.per_sample_losses / perturbed_losses"
        )
        errors.append(
            {
                "field": "body.targets.orderings",
                "loc": ["body", "targets", "orderings"],
                "message": f"{losses} losses × {orderings} orderings = {losses * orderings} loss "
                f"evaluations, more than this service plans per job "
                f"({limits.max_loss_evaluations}; CURVPLAN_PLAN_MAX_LOSS_EVALUATIONS): {hint}",
                "type": "plan_too_large",
            }
        )
    if bootstrap > limits.max_bootstrap:
        errors.append(
            {
                "field": "body.targets.bootstrap",
                "loc": ["body", "targets", "bootstrap"],
                "message": f"{bootstrap} bootstrap draws, more than this service draws per job "
                f"({limits.max_bootstrap}; CURVPLAN_PLAN_MAX_BOOTSTRAP)",
                "type": "plan_too_large",
            }
        )
    if errors:
        raise validation_problem(errors)
