"""The list filters' 422s are stated in the OpenAPI document: what the schema allows is
accepted and what it refuses is a 422 (``kind`` enum, ``tag`` pattern, no NUL in ``name``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

DOC = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())


def _schema(path: str, name: str) -> dict[str, Any]:
    (param,) = [p for p in DOC["paths"][path]["get"]["parameters"] if p["name"] == name]
    return param["schema"]


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/recommendations"])
def test_kind_and_tag_follow_the_schema(
    client: Any, auth_headers: dict[str, str], path: str
) -> None:
    kinds = _schema(path, "kind")["enum"]
    assert "plan" in kinds
    for kind in kinds:
        assert client.get(path, params={"kind": kind}, headers=auth_headers).status_code == 200
    assert client.get(path, params={"kind": "nope"}, headers=auth_headers).status_code == 422
    pattern = re.compile(_schema(path, "tag")["items"]["pattern"].replace("\\u0000", "\\x00"))
    for tag in ["team:nlp", "a:", "k:v:w", "novalue", ":v", "k\x00:v"]:
        status = client.get(path, params={"tag": tag}, headers=auth_headers).status_code
        assert status == (200 if pattern.match(tag) else 422), (tag, status)


def test_artifact_kind_filter_is_an_enum(client: Any, auth_headers: dict[str, str]) -> None:
    kinds = _schema("/v1/artifacts", "kind")["enum"]
    assert kinds == ["checkpoint", "dataset", "job-output"]
    for kind in kinds:
        response = client.get("/v1/artifacts", params={"kind": kind}, headers=auth_headers)
        assert response.status_code == 200
    bad = client.get("/v1/artifacts", params={"kind": "x"}, headers=auth_headers)
    assert bad.status_code == 422
