"""Plan jobs with batch sweeps at several token counts: bad input is a 422 naming the field,
nothing is queued; a good body is accepted as sent."""

from __future__ import annotations

from typing import Any

import pytest
from api_helpers import assert_problem, error_fields

TABLE = [{"batch_size": b, "steps": 1000.0 * (1 + 64 / b)} for b in (16, 32, 64, 128)]
SWEEPS = [{"tokens": 1e8, "steps_to_target": TABLE}, {"tokens": 1e9, "steps_to_target": TABLE}]


@pytest.mark.parametrize(
    ("measurements", "targets", "field"),
    [
        ({"batch_sweeps": SWEEPS[:1]}, {}, "body.measurements.batch_sweeps"),
        ({"batch_sweeps": [SWEEPS[0], SWEEPS[0]]}, {}, "body.measurements.batch_sweeps"),
        (
            {"batch_sweeps": [SWEEPS[0], {"tokens": 1e9, "steps_to_target": TABLE[:2]}]},
            {},
            "body.measurements.batch_sweeps.1.steps_to_target",
        ),
        (
            {"batch_sweeps": [SWEEPS[0], {**SWEEPS[1], "tokens": -1.0}]},
            {},
            "body.measurements.batch_sweeps.1.tokens",
        ),
        ({"batch_sweeps": SWEEPS}, {"target_tokens": 0.0}, "body.targets.target_tokens"),
    ],
)
def test_bad_batch_sweeps_and_target_tokens_are_a_422_naming_the_field(
    client: Any,
    auth_headers: dict[str, str],
    measurements: dict[str, Any],
    targets: dict[str, Any],
    field: str,
) -> None:
    body = {"kind": "plan", "measurements": measurements, "targets": targets}
    response = client.post("/v1/jobs", json=body, headers=auth_headers)
    assert field in error_fields(assert_problem(response, 422))
    assert client.get("/v1/jobs", headers=auth_headers).json()["items"] == []


def test_a_plan_with_batch_sweeps_and_a_target_run_is_accepted(
    client: Any, auth_headers: dict[str, str]
) -> None:
    body = {
        "kind": "plan",
        "measurements": {"batch_sweeps": SWEEPS},
        "targets": {"target_tokens": 1e10},
    }
    response = client.post("/v1/jobs", json=body, headers=auth_headers)
    assert response.status_code == 202, response.text
    job = client.get(response.headers["location"], headers=auth_headers).json()
    assert job["request"]["targets"]["target_tokens"] == 1e10
    assert len(job["request"]["measurements"]["batch_sweeps"]) == 2
