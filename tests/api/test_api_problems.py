"""Every error is RFC 9457 problem+json naming the failing field; never a traceback."""

from __future__ import annotations

from typing import Any

import pytest
from api_helpers import assert_problem, error_fields


def _post(client: Any, headers: dict[str, str], **kwargs: Any) -> Any:
    return client.post("/v1/jobs", headers=headers, **kwargs)


def test_malformed_json_is_400_problem(client, auth_headers) -> None:
    response = _post(
        client,
        auth_headers | {"Content-Type": "application/json"},
        content=b'{"kind": "plan", "measurements": {',
    )
    problem = assert_problem(response, 400)
    assert problem["title"] == "Malformed JSON"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda b: b["measurements"].__setitem__("loss_bound", "five"),
            "body.measurements.loss_bound",
        ),
        (
            lambda b: b["measurements"].__setitem__("per_sample_losses", [0.1, -1.0]),
            "body.measurements.per_sample_losses.1",
        ),
        (lambda b: b["targets"].__setitem__("tolerances", [0.0]), "body.targets.tolerances.0"),
        (lambda b: b.__setitem__("tags", {"team": 3}), "body.tags.team"),
        (lambda b: b.__setitem__("name", ""), "body.name"),
        (lambda b: b.pop("measurements"), "body.measurements"),
        (lambda b: b.pop("kind"), "body.kind"),
        (lambda b: b.__setitem__("kind", "train"), "body.kind"),
        (lambda b: b.__setitem__("colour", "red"), "body.colour"),
        (
            lambda b: b["measurements"].__setitem__("hessian_norm", 1.0),
            "body.measurements.hessian_norm",
        ),
        (lambda b: b["targets"].__setitem__("radius", float("nan")), "body.targets.radius"),
    ],
    ids=[
        "wrong-type",
        "negative-loss",
        "zero-tolerance",
        "tag-not-string",
        "empty-name",
        "missing-measurements",
        "missing-kind",
        "unknown-kind",
        "unknown-field",
        "unknown-nested-field",
        "nan",
    ],
)
def test_bad_body_is_422_naming_the_field(client, auth_headers, plan_body, mutate, field) -> None:
    mutate(plan_body)
    import json

    raw = json.dumps(plan_body)  # allows NaN, like a careless client would send
    response = _post(
        client, auth_headers | {"Content-Type": "application/json"}, content=raw.encode()
    )
    problem = assert_problem(response, 422)
    assert field in error_fields(problem), problem
    for error in problem["errors"]:
        assert error["message"] and error["loc"][0] == "body"


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"plan"', b"", b"null"])
def test_body_that_is_not_an_object_is_422(client, auth_headers, raw) -> None:
    response = _post(client, auth_headers | {"Content-Type": "application/json"}, content=raw)
    problem = assert_problem(response, 422)
    assert "body" in error_fields(problem) or "body.kind" in error_fields(problem)


def test_form_content_type_is_415(client, auth_headers) -> None:
    assert_problem(_post(client, auth_headers, data={"kind": "plan"}), 415)


@pytest.fixture
def small_app(settings, db_session):  # type: ignore[no-untyped-def]
    from curvplan_server.db import get_db
    from curvplan_server.main import create_app

    application = create_app(settings.model_copy(update={"max_body_bytes": 1000}))

    async def _db():  # type: ignore[no-untyped-def]
        yield db_session
        db_session.commit()

    application.dependency_overrides[get_db] = _db
    return application


def test_oversized_body_is_413_by_content_length(small_app, auth_headers, plan_body) -> None:
    from fastapi.testclient import TestClient

    plan_body["measurements"]["per_sample_losses"] = [0.5] * 500
    with TestClient(small_app, raise_server_exceptions=False) as c:
        problem = assert_problem(c.post("/v1/jobs", json=plan_body, headers=auth_headers), 413)
        assert problem["max_body_bytes"] == 1000
        assert (
            c.post(
                "/v1/jobs", json={"kind": "plan", "measurements": {}}, headers=auth_headers
            ).status_code
            == 202
        )


def test_oversized_chunked_body_is_413(small_app, auth_headers) -> None:
    """Without Content-Length the limit is enforced while the body streams in."""
    from fastapi.testclient import TestClient

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(100):
            yield b" " * 100

    with TestClient(small_app, raise_server_exceptions=False) as c:
        response = c.post(
            "/v1/jobs",
            content=chunks(),
            headers=auth_headers | {"Content-Type": "application/json"},
        )
    assert_problem(response, 413)
    assert "content-length" not in {k.lower() for k in response.request.headers}


def test_unknown_route_and_wrong_method_are_problems(client, auth_headers) -> None:
    assert "GET /v1/nothing" in assert_problem(client.get("/v1/nothing"), 404)["detail"]
    assert_problem(client.delete("/v1/jobs", headers=auth_headers), 405)
    assert_problem(client.put("/healthz"), 405)


def test_unhandled_exception_is_500_problem_without_traceback(app, client) -> None:
    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret-internal-detail")

    response = client.get("/boom")
    problem = assert_problem(response, 500)
    assert "secret-internal-detail" not in response.text
    assert problem["title"] == "Internal Server Error"


def test_openapi_has_clean_operation_ids_and_the_job_schema(client) -> None:
    spec = client.get("/openapi.json").json()
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "create_job",
        "get_job",
        "list_jobs",
        "cancel_job",
        "get_job_recommendation",
        "list_workers",
        "healthz",
        "readyz",
        "metrics",
    } <= ops
    create = spec["paths"]["/v1/jobs"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JobCreate"
    )
    schemas = spec["components"]["schemas"]
    assert "JobCreate" in schemas and "Measurements" in schemas
    assert "ProblemDocument" in schemas


def test_a_405_lists_every_method_of_the_path_in_allow(
    client: Any, auth_headers: dict[str, str]
) -> None:
    """``OPTIONS /v1/jobs`` answered ``Allow: GET``, though the path also takes POST."""
    response = client.options("/v1/jobs", headers=auth_headers)
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["allow"].split(",")} == {"GET", "HEAD", "POST"}
    one = client.request("PATCH", "/v1/artifacts/00000000-0000-0000-0000-000000000000")
    assert one.status_code == 405
    assert {m.strip() for m in one.headers["allow"].split(",")} == {"DELETE", "GET", "HEAD"}
