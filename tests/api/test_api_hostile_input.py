"""Hostile input that once reached the database (or a bare exception) and answered 500.

Each case must now be a 422 problem naming the field: crafted page tokens, NUL
characters (PostgreSQL text and jsonb cannot store U+0000) in query filters, in the
job body and in the Idempotency-Key header.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from api_helpers import assert_problem, error_fields


def _token(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        _token({"c": "2026-01-01T00:00:00+00:00", "i": 123, "f": "x"}),
        _token({"c": "2026-01-01T00:00:00+00:00", "i": ["a"], "f": "x"}),
        _token({"c": 5, "i": "00000000-0000-0000-0000-000000000000", "f": "x"}),
        _token(["c", "i", "f"]),
        base64.urlsafe_b64encode(b"[" * 3000).decode(),  # json recursion
        "A" * 5000,
    ],
    ids=["id-number", "id-list", "time-number", "list", "deep-json", "huge"],
)
def test_crafted_page_token_is_a_422(client: Any, auth_headers: dict[str, str], token: str) -> None:
    response = client.get("/v1/jobs", params={"page_token": token}, headers=auth_headers)
    assert error_fields(assert_problem(response, 422)) == {"query.page_token"}


def test_page_token_with_a_naive_time_is_a_422(client: Any, auth_headers: dict[str, str]) -> None:
    first = client.get("/v1/jobs", headers=auth_headers)
    assert first.status_code == 200
    # The right fingerprint (no filters), but a time without zone: not one we issued.
    from curvplan_server.jobs.service import JobFilters

    token = _token(
        {
            "c": "2026-01-01T00:00:00",
            "i": "00000000-0000-0000-0000-000000000000",
            "f": JobFilters().fingerprint,
        }
    )
    response = client.get("/v1/jobs", params={"page_token": token}, headers=auth_headers)
    assert error_fields(assert_problem(response, 422)) == {"query.page_token"}


@pytest.mark.parametrize(
    ("params", "field"),
    [({"name": "a\x00b"}, "query.name"), ({"tag": "team:n\x00lp"}, "query.tag")],
)
def test_nul_in_list_filters_is_a_422(
    client: Any, auth_headers: dict[str, str], params: dict[str, str], field: str
) -> None:
    response = client.get("/v1/jobs", params=params, headers=auth_headers)
    assert error_fields(assert_problem(response, 422)) == {field}


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('"gpt-small-pilot"', '"gpt\\u0000small"', "body.name"),
        ('"nlp"', '"n\\u0000lp"', "body.tags.team"),
    ],
)
def test_nul_in_the_job_body_is_a_422(
    client: Any,
    auth_headers: dict[str, str],
    plan_body: dict[str, Any],
    old: str,
    new: str,
    field: str,
) -> None:
    raw = json.dumps(plan_body)
    assert old in raw
    response = client.post(
        "/v1/jobs",
        content=raw.replace(old, new),
        headers={**auth_headers, "Content-Type": "application/json"},
    )
    assert error_fields(assert_problem(response, 422)) == {field}
    # Nothing was queued.
    assert client.get("/v1/jobs", headers=auth_headers).json()["items"] == []


def test_escaped_text_that_is_not_nul_still_passes(
    client: Any, auth_headers: dict[str, str], plan_body: dict[str, Any]
) -> None:
    """Control: an escaped backslash before u0000 is the text '\\u0000', not a NUL."""
    plan_body["name"] = "literal \\u0000 text"
    response = client.post("/v1/jobs", json=plan_body, headers=auth_headers)
    assert response.status_code == 202, response.text
    assert response.json()["name"] == "literal \\u0000 text"


def test_nul_in_the_idempotency_key_is_a_422(
    app: Any, auth_headers: dict[str, str], plan_body: dict[str, Any]
) -> None:
    # httpx refuses to send a NUL in a header; the ASGI app can still receive one
    # from a lenient server, so call it with a raw scope.
    import asyncio

    raw = json.dumps(plan_body).encode()
    headers = [(k.lower().encode(), v.encode()) for k, v in auth_headers.items()]
    headers += [(b"content-type", b"application/json"), (b"idempotency-key", b"a\x00b")]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/jobs",
        "raw_path": b"/v1/jobs",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = json.loads(
        b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    )
    assert start["status"] == 422, body
    assert {e["field"] for e in body["errors"]} == {"header.Idempotency-Key"}


@pytest.mark.parametrize(
    ("measurements", "field"),
    [
        ({"per_sample_losses": [1e308] * 3, "loss_bound": 1e308}, "body.measurements.loss_bound"),
        (
            {"per_sample_losses": [1e300, 1.0], "loss_bound": 2.0},
            "body.measurements.per_sample_losses.0",
        ),
    ],
)
def test_losses_whose_sums_overflow_are_a_422(
    client: Any, auth_headers: dict[str, str], measurements: dict[str, Any], field: str
) -> None:
    """[1e308] × 3 was accepted; the planner's mean overflowed to inf and the job failed
    with internal-error ("Out of range float values are not JSON compliant")."""
    body = {"kind": "plan", "measurements": measurements}
    response = client.post("/v1/jobs", json=body, headers=auth_headers)
    assert field in error_fields(assert_problem(response, 422))


def test_the_largest_accepted_losses_give_a_finite_plan() -> None:
    """At the cap the planner's answer is finite JSON (the oracle: strict JSON encoding)."""
    from curvplan.types.planner import MAX_LOSS_VALUE, Measurements, Targets
    from curvplan_core.planner import make_plan

    measurements = Measurements.model_validate_json(
        json.dumps({"per_sample_losses": [MAX_LOSS_VALUE] * 3, "loss_bound": MAX_LOSS_VALUE})
    )
    plan = make_plan(measurements, Targets.model_validate_json("{}"), seed=1)
    json.dumps(plan.model_dump(mode="json"), allow_nan=False)  # raises on inf/nan
