"""The client asks for a file's sha256 before it uploads it: content the project already has
is not sent again (the same artifact comes back), content it has not is uploaded; the lookup
(``GET /v1/artifacts?sha256=``) sees only the caller's project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import save as st_save

import curvplan


class Recording:
    """Hands each request of the client under test to the API (the TestClient), recording it."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.requests: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path))
        answer = self.api.request(
            request.method,
            str(request.url.copy_with(scheme="http", host="testserver")),
            headers=dict(request.headers),
            content=request.read(),
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def _client(client: Any, headers: dict[str, str]) -> tuple[curvplan.Client, Recording]:
    recording = Recording(client)
    key = headers["Authorization"].removeprefix("Bearer ")
    api = curvplan.Client("http://testserver", key, transport=httpx.MockTransport(recording))
    return api, recording


def _file(tmp_path: Path, name: str, value: float) -> Path:
    path = tmp_path / name
    path.write_bytes(st_save({"w": np.full((3, 3), value, dtype=np.float32)}))
    return path


def test_known_content_is_not_uploaded_again(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], tmp_path: Path
) -> None:
    first = _file(tmp_path, "a.safetensors", 1.0)
    copy = _file(tmp_path, "copy-of-a.safetensors", 1.0)  # same bytes, another name
    api, seen = _client(client, auth_headers)
    with api:
        stored = api.upload_artifact(first, "checkpoint")
        assert seen.requests.count(("POST", "/v1/artifacts")) == 1
        again = api.upload_artifact(copy, "checkpoint")
        assert again.id == stored.id and again.sha256 == stored.sha256
        assert seen.requests.count(("POST", "/v1/artifacts")) == 1  # nothing sent the 2nd time
        other = api.upload_artifact(_file(tmp_path, "b.safetensors", 2.0), "checkpoint")
        assert other.id != stored.id
        assert seen.requests.count(("POST", "/v1/artifacts")) == 2
    theirs, their_requests = _client(client, other_auth_headers)
    with theirs:  # another project does not see this project's content: it uploads its own
        assert theirs.upload_artifact(first, "checkpoint").id != stored.id
        assert their_requests.requests.count(("POST", "/v1/artifacts")) == 1


@pytest.mark.parametrize("digest", ["ABC", "0" * 63, "g" * 64])
def test_the_sha256_filter_takes_only_a_hex_digest(
    client: Any, auth_headers: dict[str, str], digest: str
) -> None:
    response = client.get("/v1/artifacts", params={"sha256": digest}, headers=auth_headers)
    assert response.status_code == 422
    assert {e["field"] for e in response.json()["errors"]} == {"query.sha256"}
