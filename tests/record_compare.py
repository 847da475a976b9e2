"""Comparing two runs' block records (shared by the engine and the end-to-end tests)."""

from __future__ import annotations

import pytest


def assert_records_close(mine: object, theirs: object, where: str) -> None:
    """Two runs' block records agree: same keys and lengths, floats to the rounding of a
    batched product (1e-8 relative, 1e-12 absolute for residuals at rounding level), the
    rest exactly. A fan-out child batches its blocks' products differently from one process
    (docs/numerics.md#lockstep)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        assert mine.keys() == theirs.keys(), where
        for key in mine:
            assert_records_close(mine[key], theirs[key], f"{where}.{key}")
    elif isinstance(mine, list) and isinstance(theirs, list):
        assert len(mine) == len(theirs), where
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert_records_close(a, b, f"{where}[{i}]")
    elif isinstance(mine, float) and isinstance(theirs, float):
        assert mine == pytest.approx(theirs, rel=1e-8, abs=1e-12), where
    else:
        assert mine == theirs, where
