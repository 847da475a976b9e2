"""Fixtures of the client tests: a live service (real API and worker processes)."""

from __future__ import annotations

from collections.abc import Iterator

import live_service
import pytest


@pytest.fixture(scope="session")
def live(
    pg_admin_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[live_service.LiveService]:
    """API + worker subprocesses on a private database (shared with tests/cli and tests/report)."""
    yield live_service.acquire(pg_admin_url, tmp_path_factory.mktemp("live-service"))
    live_service.release()
