"""Fixtures of the sweep tests: a tiny learnable language (counting mod V) and, for the end-to-end
tests, real ``curvplan serve`` + ``curvplan worker`` processes (helpers of tests/analyze)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import live_plugin
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyze"))


@pytest.fixture(scope="module")
def sweep_database(pg_admin_url: str) -> Iterator[str]:
    """A migrated database of this module alone (its worker claims every job in it)."""
    with live_plugin.private_database(pg_admin_url, "curvplan_sweep") as url:
        yield url
