"""The OpenAPI document is a reviewed artifact: docs/openapi.json must match the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_openapi_snapshot_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "openapi.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
