"""POST/GET /v1/artifacts on real PostgreSQL: streamed uploads, refusals, isolation, dedupe."""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
import uuid
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save as st_save
from sqlalchemy import text


def checkpoint_bytes(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return st_save(
        {
            "embed.weight": rng.standard_normal((8, 4)).astype(np.float32),
            "head.weight": rng.standard_normal((3, 4)).astype(np.float32),
        }
    )


def dataset_bytes() -> bytes:
    rng = np.random.default_rng(1)
    return st_save(
        {
            "inputs": rng.integers(0, 8, size=(5, 6)).astype(np.int64),
            "targets": rng.integers(0, 8, size=(5, 6)).astype(np.int64),
        }
    )


def upload(client: Any, headers: dict[str, str], data: bytes, kind: str = "checkpoint") -> Any:
    return client.post(
        "/v1/artifacts",
        headers=headers,
        files={"file": ("model.safetensors", data, "application/octet-stream")},
        data={"kind": kind},
    )


def artifact_rows(db_session: Any) -> int:
    return db_session.execute(text("SELECT count(*) FROM artifact")).scalar_one()


def assert_nothing_stored(store: Any, db_session: Any, rows_before: int) -> None:
    assert store.temp_files() == []
    assert store.blobs() == []
    assert artifact_rows(db_session) == rows_before


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert "Traceback" not in response.text
    return body


# --------------------------------------------------------------------------- success
def test_upload_stores_blob_by_sha256_and_returns_metadata(
    client: Any, auth_headers: dict[str, str], store: Any
) -> None:
    data = checkpoint_bytes()
    response = upload(client, auth_headers, data)
    assert response.status_code == 201, response.text
    body = response.json()
    digest = hashlib.sha256(data).hexdigest()
    assert body["sha256"] == digest
    assert body["size"] == len(data)
    assert body["kind"] == "checkpoint"
    assert body["storage"] == "blob"
    assert body["name"] == "model.safetensors"
    assert body["tensors"] == {
        "embed.weight": {"dtype": "F32", "shape": [8, 4]},
        "head.weight": {"dtype": "F32", "shape": [3, 4]},
    }
    assert response.headers["location"] == f"/v1/artifacts/{body['id']}"
    # Content-addressed: blobs/sha256/ab/cdef… holds exactly the uploaded bytes.
    path = store.path_for(digest)
    assert path == store.root / "sha256" / digest[:2] / digest[2:]
    assert path.read_bytes() == data
    assert store.temp_files() == []

    fetched = client.get(body["links"]["self"], headers=auth_headers)
    assert fetched.status_code == 200
    assert fetched.json() == body
    content = client.get(body["links"]["content"], headers=auth_headers)
    assert content.status_code == 200
    assert content.content == data


def test_same_content_is_stored_once_and_answers_the_first_row(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], store: Any
) -> None:
    data = checkpoint_bytes()
    first = upload(client, auth_headers, data)
    again = upload(client, auth_headers, data)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = upload(client, other_auth_headers, data)
    assert other.status_code == 201
    assert other.json()["id"] != first.json()["id"]
    assert store.blobs() == [hashlib.sha256(data).hexdigest()]


def test_dataset_upload(client: Any, auth_headers: dict[str, str]) -> None:
    response = upload(client, auth_headers, dataset_bytes(), kind="dataset")
    assert response.status_code == 201, response.text
    assert response.json()["tensors"]["inputs"] == {"dtype": "I64", "shape": [5, 6]}
    with_groups = st_save(
        {
            "inputs": np.zeros((4, 6), dtype=np.int64),
            "targets": np.zeros((4, 6), dtype=np.int64),
            "groups": np.array([0, 0, 1, 1], dtype=np.int64),  # one document id per example
        }
    )
    grouped = upload(client, auth_headers, with_groups, kind="dataset")
    assert grouped.status_code == 201, grouped.text
    assert grouped.json()["tensors"]["groups"] == {"dtype": "I64", "shape": [4]}


# --------------------------------------------------------------------------- refusals
def _lying_header() -> bytes:
    header = {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 32


BAD_FILES = {
    "pickle": (pickle.dumps({"w": [1.0, 2.0]}), "checkpoint", "pickle", None),
    "truncated": (checkpoint_bytes()[:-10], "checkpoint", "truncated", None),
    "lying-header": (_lying_header(), "checkpoint", "invalid shape, data type, or offset", None),
    "trailing-bytes": (checkpoint_bytes() + b"x", "checkpoint", "after the last tensor", None),
    "int-checkpoint": (
        st_save({"embed.weight": np.zeros((2, 2), dtype=np.int64)}),
        "checkpoint",
        "floating point",
        "embed.weight",
    ),
    "dataset-without-targets": (
        st_save({"inputs": np.zeros((2, 3), dtype=np.int64)}),
        "dataset",
        "'inputs' and 'targets'",
        "targets",
    ),
    "dataset-length-mismatch": (
        st_save(
            {"inputs": np.zeros((2, 3), dtype=np.int64), "targets": np.zeros((3, 3), np.int64)}
        ),
        "dataset",
        "examples",
        "targets",
    ),
    "dataset-float-groups": (
        st_save(
            {
                "inputs": np.zeros((2, 3), dtype=np.int64),
                "targets": np.zeros((2, 3), np.int64),
                "groups": np.zeros(2, np.float32),
            }
        ),
        "dataset",
        "int64",
        "groups",
    ),
    "dataset-groups-length": (
        st_save(
            {
                "inputs": np.zeros((2, 3), dtype=np.int64),
                "targets": np.zeros((2, 3), np.int64),
                "groups": np.zeros(3, np.int64),
            }
        ),
        "dataset",
        "one group id per example",
        "groups",
    ),
    "empty": (b"", "checkpoint", "empty", None),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_refused_and_nothing_is_stored(
    case: str, client: Any, auth_headers: dict[str, str], store: Any, db_session: Any
) -> None:
    data, kind, reason, tensor = BAD_FILES[case]
    before = artifact_rows(db_session)
    body = assert_problem(upload(client, auth_headers, data, kind=kind), 422)
    assert reason in body["detail"]
    assert body["tensor"] == tensor
    if tensor is not None:
        assert repr(tensor) in body["detail"]
    assert_nothing_stored(store, db_session, before)


def test_oversized_upload_is_413_and_nothing_is_stored(
    client: Any, auth_headers: dict[str, str], store: Any, db_session: Any, settings: Any
) -> None:
    limit = settings.max_artifact_bytes  # the fixture's limit (conftest.py)
    before = artifact_rows(db_session)
    n = limit // 8  # F64 elements: just over the limit with the header
    data = st_save({"w": np.zeros(n, dtype=np.float64)})
    assert limit < len(data) < limit + 1024
    body = assert_problem(upload(client, auth_headers, data), 413)
    assert body["max_artifact_bytes"] == limit
    assert_nothing_stored(store, db_session, before)
    # Far over the limit: the declared Content-Length is refused before reading the body.
    huge = st_save({"w": np.zeros(4 * n, dtype=np.float64)})
    assert_problem(upload(client, auth_headers, huge), 413)
    assert_nothing_stored(store, db_session, before)


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({}, "body.kind", "no 'kind'"),
        ({"kind": "model"}, "body.kind", "must be one of"),
        ({"kind": "checkpoint", "colour": "red"}, "body.colour", "unknown form field"),
    ],
)
def test_form_field_errors_name_the_field(
    fields: dict[str, str],
    field: str,
    message: str,
    client: Any,
    auth_headers: dict[str, str],
    store: Any,
) -> None:
    response = client.post(
        "/v1/artifacts",
        headers=auth_headers,
        files={"file": ("m.safetensors", checkpoint_bytes(), "application/octet-stream")},
        data=fields,
    )
    body = assert_problem(response, 422)
    assert [e["field"] for e in body["errors"]] == [field]
    assert message in body["detail"]
    assert store.temp_files() == [] and store.blobs() == []


def test_missing_file_part(client: Any, auth_headers: dict[str, str]) -> None:
    response = client.post(
        "/v1/artifacts",
        headers=auth_headers,
        files={"kind": (None, "checkpoint")},
    )
    body = assert_problem(response, 422)
    assert body["errors"][0]["field"] == "body.file"


def test_other_media_type_is_415(client: Any, auth_headers: dict[str, str]) -> None:
    response = client.post(
        "/v1/artifacts",
        headers={**auth_headers, "Content-Type": "application/octet-stream"},
        content=checkpoint_bytes(),
    )
    assert_problem(response, 415)


def test_unauthenticated_upload_is_401(client: Any) -> None:
    assert_problem(upload(client, {}, checkpoint_bytes()), 401)


# --------------------------------------------------------------------------- uri artifacts
def test_file_uri_is_registered_and_other_schemes_refused(
    client: Any, auth_headers: dict[str, str], settings: Any
) -> None:
    uri = (settings.artifact_uri_roots[0] / "sample.safetensors").as_uri()
    ok = client.post(
        "/v1/artifacts",
        headers=auth_headers,
        json={"kind": "dataset", "uri": uri, "name": "sample"},
    )
    assert ok.status_code == 201, ok.text
    body = ok.json()
    assert (body["storage"], body["uri"], body["sha256"]) == ("uri", uri, None)
    assert "content" not in body["links"]
    for uri in ("s3://bucket/x.safetensors", "http://host/x", "file://host/x", "file:///a/../b"):
        refused = client.post(
            "/v1/artifacts", headers=auth_headers, json={"kind": "dataset", "uri": uri}
        )
        problem = assert_problem(refused, 422)
        assert [e["field"] for e in problem["errors"]] == ["body.uri"], uri


# --------------------------------------------------------------------------- isolation
def test_another_projects_artifact_is_not_found(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str]
) -> None:
    artifact = upload(client, auth_headers, checkpoint_bytes()).json()
    for path in (artifact["links"]["self"], artifact["links"]["content"]):
        assert_problem(client.get(path, headers=other_auth_headers), 404)
    assert_problem(client.get(f"/v1/artifacts/{uuid.uuid4()}", headers=auth_headers), 404)
    listed = client.get("/v1/artifacts", headers=other_auth_headers).json()
    assert artifact["id"] not in {a["id"] for a in listed["items"]}


def test_list_filters_and_paginates(client: Any, auth_headers: dict[str, str]) -> None:
    ids = [upload(client, auth_headers, checkpoint_bytes(seed)).json()["id"] for seed in range(3)]
    dataset = upload(client, auth_headers, dataset_bytes(), kind="dataset").json()["id"]
    seen: list[str] = []
    token = None
    while True:
        params: dict[str, Any] = {"kind": "checkpoint", "page_size": 2}
        if token:
            params["page_token"] = token
        page = client.get("/v1/artifacts", headers=auth_headers, params=params).json()
        seen += [a["id"] for a in page["items"]]
        token = page["next_page_token"]
        if not token:
            break
    # Every checkpoint exactly once (within one test transaction created_at ties, so the
    # order among them is by id; across requests it is newest first).
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    everything = client.get("/v1/artifacts", headers=auth_headers).json()["items"]
    assert dataset in {a["id"] for a in everything}
    bad = client.get("/v1/artifacts", headers=auth_headers, params={"kind": "weights"})
    assert assert_problem(bad, 422)["errors"][0]["field"] == "query.kind"


def test_uri_roots_confine_file_artifacts(
    client: Any, auth_headers: dict[str, str], settings: Any, tmp_path: Any
) -> None:
    allowed = tmp_path / "models"
    allowed.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (allowed / "escape").symlink_to(outside)
    settings.artifact_uri_roots = [allowed]
    ok = client.post(
        "/v1/artifacts",
        headers=auth_headers,
        json={"kind": "checkpoint", "uri": (allowed / "m.safetensors").as_uri()},
    )
    assert ok.status_code == 201, ok.text
    for path in (outside / "m.safetensors", allowed / "escape" / "m.safetensors"):
        refused = client.post(
            "/v1/artifacts", headers=auth_headers, json={"kind": "checkpoint", "uri": path.as_uri()}
        )
        problem = assert_problem(refused, 422)
        assert [e["field"] for e in problem["errors"]] == ["body.uri"]
