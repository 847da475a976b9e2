"""The worker's health signal: a file touched after every heartbeat the database accepted.

Standard library only, so that ``curvplan worker-health`` (a container health check run
every few seconds) starts fast.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def touch_health_file(path: Path) -> None:
    """Set the health file's mtime to now (create it if needed)."""
    path.touch(exist_ok=True)
    os.utime(path)


def health_file_age(path: Path) -> float | None:
    """Seconds since the last heartbeat that reached the database (None: never)."""
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except FileNotFoundError:
        return None
