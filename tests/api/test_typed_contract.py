"""The typed API contract: result and recommendation models, problem+json, status codes, examples.

``tests/fixtures/*_result_v0.json`` are results exactly as the pipeline stored them before
the results were typed (generated once with the code of that time from the tiny model of
``tests/client/analyze_files.py``); rows written the old way must still answer 200 and
validate under today's response models.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    from curvplan_core.config import Settings
    from curvplan_server.main import create_app

    settings = Settings(database_url="postgresql://openapi@127.0.0.1:1/none", auth_disabled=False)
    return create_app(settings).openapi()


def _project_id(db_session: Any, headers: dict[str, str]) -> uuid.UUID:
    from curvplan_core.credentials.keys import hash_key

    key = headers["Authorization"].split(" ", 1)[1]
    return db_session.execute(
        text("SELECT project_id FROM api_key WHERE key_hash = :h"), {"h": hash_key(key)}
    ).scalar_one()


def _insert_old_row(db_session: Any, project_id: uuid.UUID, kind: str, result: Any) -> str:
    """A succeeded job written with raw SQL, as the worker of that time stored it."""
    job_id = uuid.uuid4()
    db_session.execute(
        text(
            "INSERT INTO job (id, project_id, kind, queue, name, tags, status, request, result,"
            " started_at, finished_at) VALUES (:id, :p, :kind, :queue, :name, '{}'::jsonb,"
            " 'succeeded', CAST(:request AS jsonb), CAST(:result AS jsonb), now(), now())"
        ),
        {
            "id": job_id,
            "p": project_id,
            "kind": kind,
            "queue": "cpu" if kind == "plan" else "gpu",
            "name": f"old-{kind}",
            "request": json.dumps({"kind": kind}),
            "result": json.dumps(result),
        },
    )
    db_session.commit()
    return str(job_id)


#: The fields removed so that no answer comes twice (README, "Breaking changes"), by section.
REMOVED_FIELDS = {
    "batch_size": {"recommended", "recommended_basis", "recommended_formula", "recommended_tokens"},
    "sample_size": {"recommended_criterion", "recommended_criterion_reason"},
    "per_tolerance": {"loss_accuracy", "available_is_enough", "available_is_enough_stabilisation"},
    "data": {"loss_accuracy_examples"},
    "learning_rate": {"gd_stability_limit", "lambda_max", "lambda_max_source"},
    "scaling": {"n_for_target_loss", "n_for_target_loss_ci", "n_for_target_loss_formula"},
}
#: The fields renamed so that no evidence reads as an answer: old name → new name, by section.
RENAMED_FIELDS = {
    "curvature": {"lr_ceiling_formula": "block_threshold_formula"},
    "blocks": {"lr_ceiling": "block_threshold"},
}


def without_removed_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """A stored recommendation as it reads today: the removed fields dropped, the renamed
    ones under their new name, nothing else."""
    rec = json.loads(json.dumps(rec))

    def drop(section: Any, names: set[str]) -> None:
        if isinstance(section, dict):
            for name in names:
                section.pop(name, None)

    drop(rec.get("batch_size"), REMOVED_FIELDS["batch_size"])
    drop(rec.get("sample_size"), REMOVED_FIELDS["sample_size"])
    drop(rec.get("scaling"), REMOVED_FIELDS["scaling"])
    for row in (rec.get("sample_size") or {}).get("per_tolerance") or []:
        drop(row, REMOVED_FIELDS["per_tolerance"])
    budget = rec.get("budget") or {}
    drop(budget.get("data"), REMOVED_FIELDS["data"])
    drop(budget.get("learning_rate"), REMOVED_FIELDS["learning_rate"])

    def rename(section: Any, names: dict[str, str]) -> None:
        if isinstance(section, dict):
            for old, new in names.items():
                if old in section:
                    section[new] = section.pop(old)

    curvature = rec.get("curvature")
    rename(curvature, RENAMED_FIELDS["curvature"])
    for block in (curvature or {}).get("blocks") or []:
        rename(block, RENAMED_FIELDS["blocks"])
    return rec


@pytest.mark.parametrize("kind", ["plan", "analyze"])
def test_result_stored_by_older_code_answers_under_typed_models(
    kind: str, client: Any, auth_headers: dict[str, str], db_session: Any
) -> None:
    from curvplan.types.jobs import JobOut
    from curvplan.types.planner import Recommendation
    from curvplan.types.recommendations import RecommendationPage
    from curvplan.types.results import AnalyzeResult, PlanResult

    stored = json.loads((FIXTURES / f"{kind}_result_v0.json").read_text())
    job_id = _insert_old_row(db_session, _project_id(db_session, auth_headers), kind, stored)
    # what reads back: the stored result less the removed second answers (the old batch)
    today = {**stored, "recommendation": without_removed_fields(stored["recommendation"])}
    if kind == "plan":
        assert stored["recommendation"]["batch_size"]["recommended"] == 512
        assert "recommended" not in today["recommendation"]["batch_size"]
        block = today["recommendation"]["curvature"]["blocks"][0]
        assert block["block_threshold"] == 2.0 and "lr_ceiling" not in block
        # the fit's size for the target, a second data answer beside budget.data, is dropped
        assert stored["recommendation"]["scaling"]["n_for_target_loss"] > 0
        assert "n_for_target_loss" not in today["recommendation"]["scaling"]

    answer = client.get(f"/v1/jobs/{job_id}", headers=auth_headers)
    assert answer.status_code == 200, answer.text
    job = JobOut.model_validate(answer.json())
    expected_type = AnalyzeResult if kind == "analyze" else PlanResult
    assert type(job.result) is expected_type
    # Nothing else is lost on the way through the typed model (extra engine fields are kept).
    assert job.model_dump(mode="json", exclude_unset=True)["result"] == today

    answer = client.get(f"/v1/jobs/{job_id}/recommendation", headers=auth_headers)
    assert answer.status_code == 200, answer.text
    rec = Recommendation.model_validate(answer.json())
    assert rec.model_dump(mode="json", exclude_unset=True) == today["recommendation"]

    answer = client.get("/v1/recommendations", params={"name": f"old-{kind}"}, headers=auth_headers)
    assert answer.status_code == 200, answer.text
    (item,) = RecommendationPage.model_validate(answer.json()).items
    assert str(item.job_id) == job_id and item.recommendation == rec


def _resolve(openapi: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = openapi["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def test_results_and_recommendations_are_typed(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    result = schemas["JobOut"]["properties"]["result"]
    refs = {s.get("$ref", "").rsplit("/", 1)[-1] for s in result["anyOf"]}
    assert {"AnalyzeResult", "PlanResult"} <= refs
    for name in ("AnalyzeResult", "PlanResult"):
        assert schemas[name]["properties"]["recommendation"] == {
            "$ref": "#/components/schemas/Recommendation"
        }
    listed = schemas["LatestRecommendation"]["properties"]["recommendation"]
    assert listed == {"$ref": "#/components/schemas/Recommendation"}
    get_rec = openapi["paths"]["/v1/jobs/{job_id}/recommendation"]["get"]
    schema = get_rec["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Recommendation"}
    assert set(schemas["Recommendation"]["properties"]) >= {"sample_size", "batch_size"}


def test_every_error_is_problem_json_under_its_own_media_type(openapi: dict[str, Any]) -> None:
    problem = {"$ref": "#/components/schemas/ProblemDocument"}
    checked = 0
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                if int(code) < 400:
                    continue
                content = response.get("content", {})
                assert list(content) == ["application/problem+json"], (method, path, code)
                assert content["application/problem+json"]["schema"] == problem
                checked += 1
    assert checked > 20
    assert "HTTPValidationError" not in openapi["components"]["schemas"]
    assert set(openapi["components"]["schemas"]["ProblemDocument"]["required"]) >= {
        "type",
        "title",
        "status",
    }


def test_status_codes_of_the_job_operations_are_documented(openapi: dict[str, Any]) -> None:
    jobs = openapi["paths"]["/v1/jobs"]
    job = openapi["paths"]["/v1/jobs/{job_id}"]
    cancel = openapi["paths"]["/v1/jobs/{job_id}/cancel"]["post"]
    assert set(cancel["responses"]) >= {"200", "202", "404", "409"}
    assert set(jobs["post"]["responses"]) >= {"202", "400", "401", "413", "415", "422"}
    assert "200" not in jobs["post"]["responses"]
    assert set(job["get"]["responses"]) >= {"200", "401", "404"}


def test_examples_validate_and_the_recommendation_example_is_the_planners(
    openapi: dict[str, Any],
) -> None:
    from curvplan.types.jobs import CLIENT_JOB_CREATE_ADAPTER, JobOut
    from curvplan.types.planner import Measurements, Recommendation, Targets
    from curvplan_core.planner.plan import make_plan
    from curvplan_server.jobs import examples

    create = openapi["paths"]["/v1/jobs"]["post"]
    bodies = create["requestBody"]["content"]["application/json"]["examples"]
    assert set(bodies) >= {"plan", "analyze"}
    for example in bodies.values():
        CLIENT_JOB_CREATE_ADAPTER.validate_python(example["value"])
    JobOut.model_validate(examples.JOB_EXAMPLE)
    Recommendation.model_validate(examples.RECOMMENDATION_EXAMPLE)
    again = make_plan(
        Measurements.model_validate(examples.EXAMPLE_MEASUREMENTS),
        Targets(),
        seed=examples.EXAMPLE_SEED,
    )
    assert again.model_dump(mode="json") == examples.RECOMMENDATION_EXAMPLE
    rec = openapi["paths"]["/v1/jobs/{job_id}/recommendation"]["get"]["responses"]["200"]
    # The OpenAPI document drops null members of examples.
    assert rec["content"]["application/json"]["example"] == _without_nulls(
        examples.RECOMMENDATION_EXAMPLE
    )


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
