"""``file://`` artifacts: off unless the operator names roots; nothing about other files leaks.

At registration (API) and when a job reads the file (worker): no root configured means
refused; a path outside the roots gets one answer whether it exists or not; a FIFO is
refused without blocking; an invalid file's error never quotes bytes read from it.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from test_artifacts_api import assert_problem, checkpoint_bytes


def register(client: Any, headers: dict[str, str], path: str) -> Any:
    return client.post(
        "/v1/artifacts", json={"kind": "checkpoint", "uri": f"file://{path}"}, headers=headers
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    (path / "ok.safetensors").write_bytes(checkpoint_bytes())
    return path


@pytest.fixture
def roots_enabled() -> bool:
    """Overridden with ``parametrize("roots_enabled", [True])`` where a root is configured."""
    return False


@pytest.fixture
def settings(database_url: str, tmp_path: Path, roots_enabled: bool) -> Any:
    from curvplan_core.config import Settings

    roots = roots_enabled
    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        artifact_uri_roots=[tmp_path / "models"] if roots else [],
    )


def test_registration_is_refused_when_no_root_is_configured(
    client: Any, auth_headers: dict[str, str], root: Path
) -> None:
    for path in ("/etc/passwd", str(root / "ok.safetensors")):
        problem = assert_problem(register(client, auth_headers, path), 422)
        assert {e["field"] for e in problem["errors"]} == {"body.uri"}
        assert "CURVPLAN_ARTIFACT_URI_ROOTS" in problem["detail"]


@pytest.mark.parametrize("roots_enabled", [True])
def test_paths_outside_the_roots_get_one_answer(
    client: Any, auth_headers: dict[str, str], root: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_bytes(b"k" * 64)
    answers = [
        register(client, auth_headers, path)
        for path in ("/etc/passwd", "/etc", "/nonexistent/x.safetensors", str(tmp_path / "secret"))
    ]
    bodies = {json.dumps(assert_problem(a, 422), sort_keys=True) for a in answers}
    assert len(bodies) == 1, bodies  # existing, directory and missing look the same
    inside = register(client, auth_headers, str(root / "ok.safetensors"))
    assert inside.status_code == 201, inside.text


# --------------------------------------------------------------------------- worker side
@pytest.fixture
def worker_roots(monkeypatch: pytest.MonkeyPatch, root: Path) -> Iterator[None]:
    from curvplan_core.config import get_settings

    monkeypatch.setenv("CURVPLAN_ARTIFACT_URI_ROOTS", json.dumps([str(root)]))
    get_settings.cache_clear()
    yield
    monkeypatch.delenv("CURVPLAN_ARTIFACT_URI_ROOTS")
    get_settings.cache_clear()


@pytest.fixture
def uri_artifact(engine: Any) -> Iterator[Any]:
    """Insert a file:// artifact row for a path (bypassing registration), removed afterwards."""
    project = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO project (id, name) VALUES (:id, :name)"),
            {"id": project, "name": f"uri-{project.hex[:8]}"},
        )

    def make(path: Path) -> tuple[uuid.UUID, str]:
        artifact = uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO artifact (id, project_id, kind, storage, uri)"
                    " VALUES (:id, :project, 'checkpoint', 'uri', :uri)"
                ),
                {"id": artifact, "project": project, "uri": f"file://{path}"},
            )
        return project, str(artifact)

    yield make
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM project WHERE id = :id"), {"id": project})


def _resolve(engine: Any, tmp_path: Path, project: uuid.UUID, artifact: str) -> Any:
    from curvplan_core.artifacts.blobstore import BlobStore
    from curvplan_worker.analyze.artifacts import ArtifactAccess

    access = ArtifactAccess(engine, BlobStore(tmp_path / "blobs"))
    return access.resolve(project, artifact, "checkpoint", "model")


def _job_error(engine: Any, tmp_path: Path, project: uuid.UUID, artifact: str) -> Any:
    from curvplan_worker.errors import JobError

    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(_resolve(engine, tmp_path, project, artifact))
        except JobError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert outcome, "reading the artifact blocked"
    assert isinstance(outcome[0], JobError), outcome
    return outcome[0]


@pytest.mark.usefixtures("worker_roots")
def test_worker_refuses_a_fifo_without_blocking(
    engine: Any, uri_artifact: Any, root: Path, tmp_path: Path
) -> None:
    fifo = root / "pipe.safetensors"
    os.mkfifo(fifo)
    error = _job_error(engine, tmp_path, *uri_artifact(fifo))
    assert error.type == "artifact-unreadable"
    assert "regular file" in error.detail


@pytest.mark.usefixtures("worker_roots")
def test_worker_errors_never_quote_the_files_bytes(
    engine: Any, uri_artifact: Any, root: Path, tmp_path: Path
) -> None:
    secret = b"s3cr3t!!"
    (root / "secret.safetensors").write_bytes(secret + b"rest of a private file")
    error = _job_error(engine, tmp_path, *uri_artifact(root / "secret.safetensors"))
    assert error.type == "invalid-artifact"
    for shown in (str(struct.unpack("<Q", secret)[0]), secret.decode(), secret.hex()):
        assert shown not in error.detail


def test_worker_without_roots_refuses_file_uris(
    engine: Any, uri_artifact: Any, root: Path, tmp_path: Path
) -> None:
    from curvplan_core.config import get_settings

    get_settings.cache_clear()
    assert get_settings().artifact_uri_roots == []
    error = _job_error(engine, tmp_path, *uri_artifact(root / "ok.safetensors"))
    assert error.type == "artifact-not-allowed"


@pytest.mark.usefixtures("worker_roots")
def test_worker_outside_the_roots_gives_one_answer(
    engine: Any, uri_artifact: Any, tmp_path: Path, root: Path
) -> None:
    details = set()
    for path in (Path("/etc/passwd"), Path("/etc"), Path("/nonexistent/x.safetensors")):
        project, artifact = uri_artifact(path)
        error = _job_error(engine, tmp_path, project, artifact)
        assert error.type == "artifact-not-allowed"
        details.add(error.detail.replace(f"file://{path}", "<uri>").replace(artifact, "<id>"))
    assert len(details) == 1, details
    assert _resolve(engine, tmp_path, *uri_artifact(root / "ok.safetensors")).path.name == (
        "ok.safetensors"
    )


@pytest.mark.usefixtures("worker_roots")
def test_worker_applies_the_services_header_limits(
    engine: Any,
    uri_artifact: Any,
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file:// checkpoint is held to CURVPLAN_MAX_SAFETENSORS_TENSORS like an upload: the
    same 2-tensor file passes at the default limit and is refused at a limit of 1."""
    from curvplan_core.config import get_settings

    project, artifact = uri_artifact(root / "ok.safetensors")
    assert _resolve(engine, tmp_path, project, artifact).path.name == "ok.safetensors"
    monkeypatch.setenv("CURVPLAN_MAX_SAFETENSORS_TENSORS", "1")
    get_settings.cache_clear()
    try:
        error = _job_error(engine, tmp_path, project, artifact)
    finally:
        monkeypatch.delenv("CURVPLAN_MAX_SAFETENSORS_TENSORS")
        get_settings.cache_clear()
    assert error.type == "invalid-artifact"
