"""Temp files left by a killed upload (or a worker's unfinished output) are swept when the API
starts and periodically after that; files still being written are left alone."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

OLD = time.time() - 7200


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Any:
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        temp_file_max_age_seconds=600,
        storage_sweep_seconds=0.2,
    )


def temp_file(store: Any, name: str, mtime: float | None) -> Path:
    store.ensure()
    path = store.tmp_dir / name
    path.write_bytes(b"x" * 1024)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_stale_temp_files_are_swept_at_start_up_and_periodically(settings: Any, store: Any) -> None:
    from fastapi.testclient import TestClient

    from curvplan_server.main import create_app

    stale_upload = temp_file(store, "upload-deadbeef", OLD)
    stale_output = temp_file(store, "output-deadbeef", OLD)
    live_upload = temp_file(store, "upload-inflight", None)
    unrelated = temp_file(store, "keep-me", OLD)
    application = create_app(settings)
    try:
        with TestClient(application) as client:
            assert client.get("/healthz").status_code == 200
            assert not stale_upload.exists() and not stale_output.exists()
            assert live_upload.exists() and unrelated.exists()
            # Left behind while the API runs (another process died): gone within a few sweeps.
            later = temp_file(store, "upload-later", OLD)
            deadline = time.monotonic() + 10
            while later.exists():
                assert time.monotonic() < deadline, "the periodic sweep did not run"
                time.sleep(0.05)
            assert live_upload.exists()
    finally:
        application.state.engine.dispose()


def _post_stalling(app: Any, auth: str, chunks: list[bytes], stall: Any) -> tuple[int, Any]:
    """POST ``chunks`` over ASGI, calling ``stall()`` before the last chunk is handed over
    (the client went quiet half-way); return the status and the JSON answer."""
    import asyncio
    import json

    handed = 0
    answer: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal handed
        if handed == len(chunks) - 1:
            stall()
        handed += 1
        return {
            "type": "http.request",
            "body": chunks[handed - 1],
            "more_body": handed < len(chunks),
        }

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = dict(message["headers"])
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/artifacts",
        "raw_path": b"/v1/artifacts",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", auth.encode()),
            (b"content-type", b"multipart/form-data; boundary=stallboundary"),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    assert answer["headers"][b"content-type"].startswith(b"application/problem+json")
    return answer["status"], json.loads(answer["body"])


def test_an_upload_whose_temp_file_was_swept_is_a_408_and_stores_nothing(
    app: Any, client: Any, auth_headers: dict[str, str], store: Any
) -> None:
    """The sweeper removes the temp file of an upload silent past the age limit; when the
    rest arrives the answer is a 408 problem (it was an unhandled FileNotFoundError)."""
    import numpy as np
    from safetensors.numpy import save

    from curvplan_core.storage.blobs import sweep_temp_files

    data = save({"w": np.arange(64, dtype=np.float32)})
    head = (
        b'--stallboundary\r\nContent-Disposition: form-data; name="kind"\r\n\r\n'
        b'checkpoint\r\n--stallboundary\r\nContent-Disposition: form-data; name="file"; '
        b'filename="m.safetensors"\r\nContent-Type: application/octet-stream\r\n\r\n'
    )
    half = len(data) // 2
    chunks = [head + data[:half], data[half:] + b"\r\n--stallboundary--\r\n"]

    def stall() -> None:
        (partial,) = store.temp_files()
        os.utime(partial, (OLD, OLD))
        assert sweep_temp_files(store, max_age_seconds=600) == [partial]

    status, problem = _post_stalling(app, auth_headers["Authorization"], chunks, stall)
    assert status == 408, problem
    assert "send the file again" in problem["detail"]
    assert store.temp_files() == [] and store.blobs() == []
    assert client.get("/v1/artifacts", headers=auth_headers).json()["items"] == []
