"""The ``analyze`` kind: checkpoint + data sample → curvature measurements → recommendation.

The pipeline lives in :mod:`workers.analysis.pipeline`; importing this module imports torch
(in the forkserver of a ``gpu`` worker, never in the worker parent).
"""

from __future__ import annotations

import workers.curvature.api  # noqa: F401  (preload torch and the engine in the forkserver)
from workers.analysis.pipeline import run

__all__ = ["run"]
