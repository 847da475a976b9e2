"""Fixtures of the artifact tests: the API with a private blob store and a small size limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

MAX_ARTIFACT_BYTES = 64 * 1024


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    """Service settings with the blob store under ``tmp_path`` and a 64 KiB upload limit."""
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        max_artifact_bytes=MAX_ARTIFACT_BYTES,
        # file:// artifacts are refused unless the operator names roots: one under the data dir.
        artifact_uri_roots=[tmp_path / "data" / "files"],
    )


@pytest.fixture
def store(settings: Any) -> Any:
    """The blob store the app under test writes to."""
    from curvplan_core.artifacts.blobstore import default_store

    return default_store(settings.data_dir)
