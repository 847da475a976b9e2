"""Plan jobs with the budget's new inputs: bad per_sample_groups are a 422 naming the field,
before anything is queued."""

from __future__ import annotations

from typing import Any

from api_helpers import assert_problem, error_fields


def test_groups_that_do_not_match_the_losses_are_422_naming_the_field(
    client: Any, auth_headers: dict[str, str]
) -> None:
    body = {
        "kind": "plan",
        "measurements": {"per_sample_losses": [0.5, 0.6, 0.7], "per_sample_groups": [0, 1]},
    }
    problem = assert_problem(client.post("/v1/jobs", json=body, headers=auth_headers), 422)
    assert error_fields(problem) == {"body.measurements.per_sample_groups"}
    body["measurements"]["per_sample_groups"] = [0, "a", 1]
    problem = assert_problem(client.post("/v1/jobs", json=body, headers=auth_headers), 422)
    assert error_fields(problem) <= {
        "body.measurements.per_sample_groups",
        "body.measurements.per_sample_groups.1",
    }
    assert client.get("/v1/jobs", headers=auth_headers).json()["items"] == []


def test_full_model_curvature_is_validated_naming_the_field(
    client: Any, auth_headers: dict[str, str]
) -> None:
    body = {"kind": "plan", "measurements": {"full_model": {"lambda_max": "big"}}}
    problem = assert_problem(client.post("/v1/jobs", json=body, headers=auth_headers), 422)
    assert any(f.startswith("body.measurements.full_model") for f in error_fields(problem))
