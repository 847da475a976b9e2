"""Assemble a Recommendation from validated measurements and targets."""

from __future__ import annotations

from app.planner.schemas import Measurements, Recommendation, Targets


def make_plan(measurements: Measurements, targets: Targets, *, seed: int = 0) -> Recommendation:
    """Turn measurements into a data budget (design.md §3)."""
    raise NotImplementedError("planner internals are being built (issue 3)")
