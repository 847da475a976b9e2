"""A report whose inputs span a degenerate range explains it instead of answering 500."""

from __future__ import annotations

import json
from typing import Any

from plan_bodies import full_measurements, full_targets
from sqlalchemy import update

from curvplan.types.jobs import CLIENT_JOB_CREATE_ADAPTER
from curvplan_core.credentials.keys import lookup_key
from curvplan_core.jobs.models import Job
from curvplan_server.jobs import service


def test_report_of_a_plan_with_subnormal_steps_explains_the_plot(
    client: Any, db_session: Any, api_key: str, auth_headers: dict[str, str]
) -> None:
    from curvplan.types.planner import StepsPoint
    from curvplan_core.planner import Measurements, Targets, make_plan

    measurements, targets = full_measurements(), full_targets()
    # Every batch size needs 5e-324 steps: both ends of the log axis are the same number. The
    # schema refuses such steps today (at least 1e-100); a result stored before that bound
    # still carries them, so the plan is made from measurements built without validation.
    valid = Measurements.model_validate_json(json.dumps(measurements))
    subnormal = valid.model_copy(
        update={
            "steps_to_target": [
                StepsPoint.model_construct(batch_size=b, steps=5e-324) for b in (32, 64, 128, 256)
            ]
        }
    )
    rec = make_plan(subnormal, Targets.model_validate_json(json.dumps(targets)), seed=0)
    project_id = lookup_key(db_session, api_key).project_id  # type: ignore[union-attr]
    body = {"kind": "plan", "name": "subnormal", "measurements": measurements, "targets": targets}
    model = CLIENT_JOB_CREATE_ADAPTER.validate_python(body)
    job_id = service.create_job(db_session, project_id, model, default_max_attempts=3).job.id
    stored = {**body, "measurements": {**measurements, "steps_to_target": [
        {"batch_size": b, "steps": 5e-324} for b in (32, 64, 128, 256)
    ]}}  # fmt: skip
    db_session.execute(
        update(Job.__table__)
        .where(Job.__table__.c.id == job_id)
        .values(
            status="succeeded",
            request=stored,
            result={"recommendation": rec.model_dump(mode="json")},
        )
    )
    db_session.commit()

    response = client.get(f"/v1/jobs/{job_id}/report", headers=auth_headers)
    assert response.status_code == 200, response.text
    html = response.text
    section = html[html.index('id="section-batch-size"') :]
    section = section[: section.index("</section>")]
    assert "degenerate" in section and "steps" in section
    # The other plots are still drawn.
    assert 'id="loss-vs-data"' in html and 'id="delta-curve"' in html
