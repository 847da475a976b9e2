"""Fixtures of the webhook tests: a real HTTP receiver, committed rows, webhook settings."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))  # plan_bodies

from receiver import Receiver, start_receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from start_receiver()


@pytest.fixture
def settings(database_url: str) -> Any:
    """API settings that allow callbacks to this machine (loopback explicitly allowed)."""
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        webhook_allowed_hosts=["127.0.0.1"],
        webhook_allowed_networks=["127.0.0.0/8"],
    )
