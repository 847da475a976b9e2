"""The ``analyze`` kind: checkpoint + data sample → curvature measurements → recommendation.

The pipeline lives in :mod:`curvplan_worker.analyze.pipeline`; importing this module imports torch
(in the forkserver of a ``gpu`` worker, never in the worker parent).
"""

from __future__ import annotations

import curvplan_worker.curvature.analyze  # noqa: F401  (preload torch and the engine in the forkserver)
from curvplan_worker.analyze.pipeline import run

__all__ = ["run"]
