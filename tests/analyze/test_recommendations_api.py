"""GET /v1/recommendations: the latest succeeded recommendation per name, filtered, paginated."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: A real plan recommendation (what a worker stored); each job's gets its minutes as seed.
RECOMMENDATION = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "plan_result_v0.json").read_text()
)["recommendation"]


def _project_id(db_session: Any, headers: dict[str, str]) -> uuid.UUID:
    from curvplan_core.credentials.keys import hash_key

    key = headers["Authorization"].split(" ", 1)[1]
    return db_session.execute(
        text("SELECT project_id FROM api_key WHERE key_hash = :h"), {"h": hash_key(key)}
    ).scalar_one()


def _job(
    db_session: Any,
    project_id: uuid.UUID,
    name: str | None,
    *,
    minutes: int,
    status: str = "succeeded",
    kind: str = "plan",
    tags: dict[str, str] | None = None,
) -> str:
    job_id = uuid.uuid4()
    result = (
        {"recommendation": {**RECOMMENDATION, "seed": minutes}} if status == "succeeded" else None
    )
    db_session.execute(
        text(
            "INSERT INTO job (id, project_id, kind, queue, name, tags, status, request, result,"
            " finished_at) VALUES (:id, :p, :kind, :queue, :name, CAST(:tags AS jsonb), :status,"
            " '{}'::jsonb, CAST(:result AS jsonb), :finished)"
        ),
        {
            "id": job_id,
            "p": project_id,
            "kind": kind,
            "queue": "cpu" if kind == "plan" else "gpu",
            "name": name,
            "tags": json.dumps(tags or {}),
            "status": status,
            "result": json.dumps(result) if result else None,
            "finished": T0 + timedelta(minutes=minutes),
        },
    )
    db_session.commit()
    return str(job_id)


def _markers(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [_marker(item) for item in response.json()["items"]]


def _marker(item: dict[str, Any]) -> str:
    """Which stored job an item is: its name and the seed its recommendation was given."""
    return f"{item['name']}@{item['recommendation']['seed']}"


def test_latest_succeeded_per_name(
    client: Any, auth_headers: dict[str, str], other_auth_headers: dict[str, str], db_session: Any
) -> None:
    me = _project_id(db_session, auth_headers)
    other = _project_id(db_session, other_auth_headers)
    _job(db_session, me, "gpt-a", minutes=1)
    latest_a = _job(db_session, me, "gpt-a", minutes=5, kind="analyze", tags={"team": "nlp"})
    _job(db_session, me, "gpt-a", minutes=9, status="failed")  # newer but not succeeded
    _job(db_session, me, "gpt-b", minutes=3, tags={"team": "vision"})
    _job(db_session, me, None, minutes=7)  # no name: cannot be asked for by name
    _job(db_session, other, "gpt-a", minutes=20)  # another project's

    response = client.get("/v1/recommendations", headers=auth_headers)
    assert _markers(response) == ["gpt-a@5", "gpt-b@3"]
    first = response.json()["items"][0]
    assert (first["name"], first["job_id"], first["kind"]) == ("gpt-a", latest_a, "analyze")
    assert first["links"]["recommendation"] == f"/v1/jobs/{latest_a}/recommendation"

    by_name = client.get("/v1/recommendations", headers=auth_headers, params={"name": "gpt-b"})
    assert _markers(by_name) == ["gpt-b@3"]
    by_tag = client.get("/v1/recommendations", headers=auth_headers, params={"tag": "team:nlp"})
    assert _markers(by_tag) == ["gpt-a@5"]
    by_kind = client.get("/v1/recommendations", headers=auth_headers, params={"kind": "plan"})
    assert _markers(by_kind) == ["gpt-a@1", "gpt-b@3"]  # the latest *plan* of gpt-a
    theirs = client.get("/v1/recommendations", headers=other_auth_headers)
    assert _markers(theirs) == ["gpt-a@20"]


def test_pagination_walks_every_name_once(
    client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    me = _project_id(db_session, auth_headers)
    names = [f"model-{i:02d}" for i in range(7)]
    for i, name in enumerate(names):
        _job(db_session, me, name, minutes=i)
        _job(db_session, me, name, minutes=100 + i)
    seen: list[str] = []
    token = None
    while True:
        params: dict[str, Any] = {"page_size": 3}
        if token:
            params["page_token"] = token
        page = client.get("/v1/recommendations", headers=auth_headers, params=params).json()
        seen += [_marker(item) for item in page["items"]]
        token = page["next_page_token"]
        if not token:
            break
    assert seen == [f"{name}@{100 + i}" for i, name in enumerate(names)]


def test_bad_filters_are_422_naming_the_parameter(
    client: Any, auth_headers: dict[str, str]
) -> None:
    for params, field in (
        ({"kind": "train"}, "query.kind"),
        ({"tag": "no-colon"}, "query.tag"),
        ({"page_token": "garbage!"}, "query.page_token"),
    ):
        response = client.get("/v1/recommendations", headers=auth_headers, params=params)
        assert response.status_code == 422, response.text
        assert [e["field"] for e in response.json()["errors"]] == [field]
