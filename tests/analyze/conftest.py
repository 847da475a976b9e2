"""Fixtures of the analyze tests: the API on a private blob store (in-process tests)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# The tiny model's files (tests/client/analyze_files.py), as tests/cli and tests/report use them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
    )
