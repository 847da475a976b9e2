"""An upload whose header already disqualifies it is refused before the rest is read.

The app is driven directly over ASGI with a ``receive`` that counts the chunks it hands
out: the oracle is how much of the body the server asked for.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest

CHUNK = 16 * 1024
BOUNDARY = b"earlycheckboundary"


def header_bytes(tensors: dict[str, tuple[str, list[int]]]) -> tuple[bytes, int]:
    """A safetensors prefix (length + header) and the buffer size it declares."""
    sizes = {"F32": 4, "I64": 8}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw, offset


def body_chunks(fields: list[tuple[str, bytes]], file_prefix: bytes, file_rest: int) -> list[bytes]:
    head = b""
    for name, value in fields:
        head += b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="'
        head += name.encode() + b'"\r\n\r\n' + value + b"\r\n"
    head += b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="file"; '
    head += b'filename="m.safetensors"\r\nContent-Type: application/octet-stream\r\n\r\n'
    chunks = [head + file_prefix]
    rest = file_rest
    while rest > 0:
        chunks.append(b"\x00" * min(CHUNK, rest))
        rest -= CHUNK
    chunks.append(b"\r\n--" + BOUNDARY + b"--\r\n")
    return chunks


def drive(app: Any, path: str, query: bytes, auth: str, chunks: list[bytes]) -> tuple[int, int]:
    """POST ``chunks`` to the app; return (status, chunks the app asked for)."""
    handed = 0
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        nonlocal handed
        if handed < len(chunks):
            handed += 1
            return {
                "type": "http.request",
                "body": chunks[handed - 1],
                "more_body": handed < len(chunks),
            }
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", auth.encode()),
            (b"content-type", b"multipart/form-data; boundary=" + BOUNDARY),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    return status[0], handed


@pytest.fixture
def settings(database_url: str, tmp_path: Any) -> Any:
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        max_artifact_bytes=4 << 20,
    )


def test_kind_field_first_refuses_a_wrong_dtype_after_the_header(
    app: Any, auth_headers: dict[str, str], store: Any
) -> None:
    prefix, size = header_bytes({"inputs": ("F32", [256, 1024]), "targets": ("F32", [256])})
    chunks = body_chunks([("kind", b"checkpoint")], prefix, size)
    # A checkpoint is fine with floats: the control case reads everything.
    status, handed = drive(app, "/v1/artifacts", b"", auth_headers["Authorization"], chunks)
    assert status == 201 and handed == len(chunks)

    prefix, size = header_bytes({"weights": ("F32", [256, 1024])})
    chunks = body_chunks([("kind", b"dataset")], prefix, size)
    assert len(chunks) > 60
    status, handed = drive(app, "/v1/artifacts", b"", auth_headers["Authorization"], chunks)
    assert status == 422
    assert handed <= 2, f"read {handed} of {len(chunks)} chunks"
    assert store.temp_files() == []


def test_kind_in_the_query_refuses_a_declared_size_over_the_limit(
    app: Any, auth_headers: dict[str, str], settings: Any, store: Any
) -> None:
    prefix, size = header_bytes({"w": ("F32", [2048, 1024])})  # 8 MiB declared
    assert size > settings.max_artifact_bytes
    chunks = body_chunks([], prefix, 1 << 20)  # only 1 MiB is actually sent
    status, handed = drive(
        app, "/v1/artifacts", b"kind=checkpoint", auth_headers["Authorization"], chunks
    )
    assert status == 413
    assert handed <= 2, f"read {handed} of {len(chunks)} chunks"
    assert store.temp_files() == []
