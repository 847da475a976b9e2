"""The shared live service for the pipeline-step test that runs against a real server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))

import live_service


@pytest.fixture(scope="session")
def live(
    pg_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[live_service.LiveService]:
    """API + worker subprocesses on a private database (shared with tests/client and cli)."""
    yield live_service.acquire(pg_admin_url, tmp_path_factory.mktemp("live-service"))
    live_service.release()
