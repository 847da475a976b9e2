"""The batch sizes a batch or branch sweep runs (one ladder for both planners)."""

from __future__ import annotations

from curvplan.types.sweep import SweepSettings
from curvplan_worker.errors import JobError


def batch_ladder(sweep: SweepSettings) -> list[int]:
    """``sweep.batch_sizes`` (default ``DEFAULT_BATCH_SIZES``), distinct and ascending (the
    contract's :meth:`~curvplan.types.sweep.SweepSettings.ladder`, which the API checks)."""
    return sweep.ladder()


def checked_batch_ladder(sweep: SweepSettings, n_train: int) -> list[int]:
    """:func:`batch_ladder`, refused (``invalid-request`` naming ``sweep.batch_sizes``) when a
    size exceeds the training data."""
    sizes = batch_ladder(sweep)
    too_big = [b for b in sizes if b > n_train]
    if too_big:
        raise JobError(
            "invalid-request",
            "Invalid sweep request",
            f"sweep.batch_sizes: {too_big} exceed the training data ({n_train} examples)",
        )
    return sizes
