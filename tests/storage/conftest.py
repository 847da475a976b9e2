"""Fixtures of the storage tests: the API on a private blob store, and a "live" variant whose
requests commit for real (for tests of concurrent transactions)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import committed_key


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        max_artifact_bytes=64 * 1024,
        artifact_uri_roots=[tmp_path / "files"],
    )


@pytest.fixture
def store(settings: Any) -> Any:
    from curvplan_core.artifacts.blobstore import default_store

    return default_store(settings.data_dir)


@pytest.fixture
def live_client(settings: Any) -> Iterator[Any]:
    """A TestClient of an app whose sessions commit for real (no per-test transaction)."""
    from fastapi.testclient import TestClient

    from curvplan_server.main import create_app

    application = create_app(settings)
    with TestClient(application, raise_server_exceptions=False) as client:
        yield client
    application.state.engine.dispose()


@pytest.fixture
def live_headers(database_url: str) -> dict[str, str]:
    key = committed_key(database_url, f"storage-{uuid.uuid4().hex[:8]}")
    return {"Authorization": f"Bearer {key}"}
