"""Request shapes that once answered 500 on the artifact routes: each is now a 4xx naming the field.

PostgreSQL's text and jsonb refuse U+0000, psycopg cannot encode a lone surrogate, and
Python's json recursion has a limit: without the checks below each of these reached the
database (or a bare exception) and answered 500.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest
from test_artifacts_api import assert_problem, checkpoint_bytes


def _fields(problem: dict[str, Any]) -> set[str]:
    return {e["field"] for e in problem.get("errors") or []}


def _token(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode("utf-8", "surrogatepass")).decode().rstrip("=")


@pytest.mark.parametrize(
    "raw",
    [
        '{"c": "2026-01-01T00:00:00+00:00", "i": 123, "f": "None|None"}',
        '{"c": ["x"], "i": "00000000-0000-0000-0000-000000000000", "f": "None|None"}',
        "[" * 5000 + "]" * 5000,
        '{"c": "2026-01-01T00:00:00+00:00", "i": "00000000-0000-0000-0000-000000000000", '
        '"f": "\\u0000"}',
        '{"c": "2026-01-01T00:00:00+00:00\\ud800", "i": "x", "f": "None|None"}',
        '{"c": "2026-01-01T00:00:00", "i": "00000000-0000-0000-0000-000000000000", '
        '"f": "None|None"}',
    ],
    ids=["id-number", "time-list", "nested", "nul", "lone-surrogate", "naive-time"],
)
def test_crafted_artifact_page_token_is_a_422(
    client: Any, auth_headers: dict[str, str], raw: str
) -> None:
    response = client.get("/v1/artifacts", params={"page_token": _token(raw)}, headers=auth_headers)
    assert _fields(assert_problem(response, 422)) == {"query.page_token"}


@pytest.mark.parametrize(
    "raw",
    [
        '{"n": "\\u0000", "f": "x"}',
        '{"n": "\\udc00", "f": "x"}',
        '{"n": {"x": 1}, "f": "x"}',
        "[" * 5000 + "]" * 5000,
        '{"n": 7, "f": 8}',
    ],
    ids=["nul", "lone-surrogate", "object", "nested", "numbers"],
)
def test_crafted_recommendation_page_token_is_a_422(
    client: Any, auth_headers: dict[str, str], raw: str
) -> None:
    from curvplan_server.jobs.service import JobFilters

    # The right fingerprint where there is one, so the name itself reaches the query.
    raw = raw.replace('"f": "x"', f'"f": "{JobFilters().fingerprint}"')
    response = client.get(
        "/v1/recommendations", params={"page_token": _token(raw)}, headers=auth_headers
    )
    assert _fields(assert_problem(response, 422)) == {"query.page_token"}


def test_nul_in_a_registered_artifact_name_is_a_422(
    client: Any, auth_headers: dict[str, str]
) -> None:
    body = '{"kind": "checkpoint", "uri": "file:///data/m.safetensors", "name": "a\\u0000b"}'
    response = client.post(
        "/v1/artifacts",
        content=body.encode(),
        headers={**auth_headers, "Content-Type": "application/json"},
    )
    assert _fields(assert_problem(response, 422)) == {"body.name"}


def test_lone_surrogate_in_a_registered_artifact_name_is_a_4xx(
    client: Any, auth_headers: dict[str, str]
) -> None:
    body = '{"kind": "checkpoint", "uri": "file:///data/m.safetensors", "name": "a\\ud800b"}'
    response = client.post(
        "/v1/artifacts",
        content=body.encode(),
        headers={**auth_headers, "Content-Type": "application/json"},
    )
    # pydantic's JSON parser already refuses an unpaired surrogate escape as malformed JSON.
    assert_problem(response, 400)


def _multipart(parts: list[tuple[bytes, bytes]]) -> tuple[bytes, str]:
    boundary = b"hardeningboundary"
    body = b""
    for disposition, content in parts:
        body += b"--" + boundary + b"\r\nContent-Disposition: form-data; " + disposition
        body += b"\r\n\r\n" + content + b"\r\n"
    body += b"--" + boundary + b"--\r\n"
    return body, f"multipart/form-data; boundary={boundary.decode()}"


@pytest.mark.parametrize(
    ("parts", "field"),
    [
        ([(b'name="kind"', b"checkpoint"), (b'name="name"', b"a\x00b")], "body.name"),
        (
            [(b'name="kind"', b"checkpoint"), (b'name="file"; filename="m\x00.st"', b"")],
            "body.file",
        ),
    ],
    ids=["name-field", "raw-filename"],
)
def test_nul_in_multipart_text_is_a_422(
    client: Any, auth_headers: dict[str, str], store: Any, parts: Any, field: str
) -> None:
    parts = [(d, c if c else checkpoint_bytes()) for d, c in parts]
    if not any(b'"file"' in d for d, _ in parts):
        parts.append((b'name="file"; filename="m.safetensors"', checkpoint_bytes()))
    body, content_type = _multipart(parts)
    response = client.post(
        "/v1/artifacts", content=body, headers={**auth_headers, "Content-Type": content_type}
    )
    assert field in _fields(assert_problem(response, 422))
    assert store.temp_files() == [] and store.blobs() == []


def _safetensors_with_header(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    "header",
    [
        b'{"a\\u0000b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        b'{"a\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        b'{"__metadata__": {"k": "v\\u0000"}, '
        b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        b'{"__metadata__": {"k\\udfff": "v"}, '
        b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
        b'{"w": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    ],
    ids=["name-nul", "name-surrogate", "metadata-nul", "metadata-surrogate", "nested-50000"],
)
def test_hostile_safetensors_header_is_a_422(
    client: Any, auth_headers: dict[str, str], store: Any, header: bytes
) -> None:
    data = _safetensors_with_header(header) + b"\x00" * 4
    response = client.post(
        "/v1/artifacts",
        headers=auth_headers,
        files={"file": ("m.safetensors", data, "application/octet-stream")},
        data={"kind": "checkpoint"},
    )
    problem = assert_problem(response, 422)
    assert any(f.startswith("body.file") for f in _fields(problem))
    assert store.temp_files() == [] and store.blobs() == []


@pytest.fixture
def settings(database_url: str, tmp_path: Any) -> Any:
    """The artifact settings with room for a 100 kB header (the 50,000-deep nesting case)."""
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        data_dir=tmp_path / "data",
        max_artifact_bytes=1 << 20,
    )


HUGE_INTEGER_HEADER = (
    b'{"w": {"dtype": "F32", "shape": [' + b"1" * 5000 + b'], "data_offsets": [0, 4]}}'
)


def _form(fields: list[tuple[str, bytes]], boundary: bytes = b"hugeintboundary") -> bytes:
    body = b""
    for name, value in fields:
        extra = b'; filename="m.safetensors"' if name == "file" else b""
        body += b"--" + boundary + b'\r\nContent-Disposition: form-data; name="'
        body += name.encode() + b'"' + extra + b"\r\n\r\n" + value + b"\r\n"
    return body + b"--" + boundary + b"--\r\n"


@pytest.mark.parametrize("kind_first", [True, False], ids=["kind-first", "file-first"])
def test_header_integer_of_over_4300_digits_is_a_422(
    client: Any, auth_headers: dict[str, str], store: Any, kind_first: bool
) -> None:
    """Python's int parsing refuses over 4,300 digits with a ValueError that is no
    JSONDecodeError: it reached the route as a 500, whichever field came first."""
    data = _safetensors_with_header(HUGE_INTEGER_HEADER) + b"\x00" * 4
    fields = [("kind", b"checkpoint"), ("file", data)]
    body = _form(fields if kind_first else fields[::-1])
    response = client.post(
        "/v1/artifacts",
        headers={**auth_headers, "Content-Type": "multipart/form-data; boundary=hugeintboundary"},
        content=body,
    )
    problem = assert_problem(response, 422)
    assert "body.file" in _fields(problem) and "4300" in problem["detail"]
    assert store.temp_files() == [] and store.blobs() == []


def test_an_upload_name_longer_than_200_characters_is_a_422(
    client: Any, auth_headers: dict[str, str], store: Any
) -> None:
    """The OpenAPI says maxLength 200; a 1,000-character name was accepted."""

    def post(name: str | None, filename: str = "m.safetensors", seed: int = 0) -> Any:
        data = {"kind": "checkpoint", **({"name": name} if name is not None else {})}
        files = {"file": (filename, checkpoint_bytes(seed), "application/octet-stream")}
        return client.post("/v1/artifacts", headers=auth_headers, data=data, files=files)

    problem = assert_problem(post("n" * 1000), 422)
    assert _fields(problem) == {"body.name"}
    assert store.temp_files() == [] and store.blobs() == []
    assert post("n" * 200).status_code == 201
    long_file = post(None, "f" * 240 + ".safetensors", seed=1)  # only the default label
    assert long_file.status_code == 201 and long_file.json()["name"] == "f" * 200
