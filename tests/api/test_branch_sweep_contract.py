"""The branch sweep in the typed contract: its request fields, a sweep job's typed result with
the per-checkpoint CBS and the warm-up schedule, and budget.batch's branch fields."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    from curvplan_core.config import Settings
    from curvplan_server.main import create_app

    settings = Settings(database_url="postgresql://openapi@127.0.0.1:1/none", auth_disabled=False)
    return create_app(settings).openapi()["components"]["schemas"]


def _ref(schema: dict[str, Any]) -> str:
    """The component a property points at (directly, in an array, or as an optional)."""
    for option in schema.get("anyOf", [schema]):
        target = option.get("items", option)
        if "$ref" in target:
            return target["$ref"].rsplit("/", 1)[1]
    raise AssertionError(schema)


def test_the_branch_request_fields_are_typed(schemas: dict[str, Any]) -> None:
    settings = schemas["SweepSettings"]["properties"]
    assert set(settings["type"]["enum"]) == {"batch", "data", "branch"}
    assert settings["compare"]["enum"] == ["end", "window"]
    assert (
        settings["tolerance"]["exclusiveMinimum"] == 0 and settings["tolerance"]["default"] == 0.01
    )
    assert settings["window_evals"]["minimum"] == 1 and settings["window_evals"]["default"] == 4
    window = next(o for o in settings["window_tokens"]["anyOf"] if o.get("type") == "integer")
    assert window["minimum"] == 1
    checkpoints = schemas["SweepJobCreate"]["properties"]["checkpoints"]
    assert checkpoints["type"] == "array" and checkpoints["items"]["format"] == "uuid"
    assert checkpoints["maxItems"] == 16


def test_a_sweep_jobs_result_types_the_branch_result(schemas: dict[str, Any]) -> None:
    result = schemas["JobOut"]["properties"]["result"]
    assert "SweepJobResult" in {o.get("$ref", "").rsplit("/", 1)[-1] for o in result["anyOf"]}
    assert _ref(schemas["SweepJobResult"]["properties"]["sweep"]) == "SweepResult"
    assert _ref(schemas["SweepResult"]["properties"]["branch"]) == "BranchResult"
    branch = schemas["BranchResult"]
    assert {"rule", "formula", "tolerance", "compare", "window_tokens", "checkpoints"} <= set(
        branch["required"]
    )
    assert _ref(branch["properties"]["checkpoints"]) == "BranchCheckpoint"
    assert _ref(branch["properties"]["warmup_schedule"]) == "BatchWarmupStage"
    checkpoint = schemas["BranchCheckpoint"]["properties"]
    assert _ref(checkpoint["curves"]) == "BranchCurve"
    assert {"step", "critical_batch", "next_batch", "status"} <= set(checkpoint)
    curve = schemas["BranchCurve"]["properties"]
    assert curve["tokens"]["items"]["type"] == "number"
    within = {o.get("type") for o in curve["within_tolerance"]["anyOf"]}
    assert within == {"boolean", "null"}  # null: the checkpoint's CBS is not measured
    stage = schemas["BatchWarmupStage"]
    assert {"from_step", "batch_size", "status"} <= set(stage["required"])


def test_budget_batch_names_the_branch_source_and_carries_the_schedule(
    schemas: dict[str, Any],
) -> None:
    from curvplan_core.planner.budget_section import BATCH_SOURCE_ORDER

    batch = schemas["BudgetBatch"]["properties"]
    # Every source the planner ranks, and nothing else (the order that leads is the planner's).
    assert set(batch["source"]["enum"]) == {*BATCH_SOURCE_ORDER, "not_available"}
    assert "branch_sweep" in BATCH_SOURCE_ORDER
    assert _ref(batch["warmup_schedule"]) == "BatchWarmupStage"
    bracket = next(o for o in batch["critical_bracket"]["anyOf"] if o.get("type") == "array")
    assert bracket["maxItems"] == bracket["minItems"] == 2
    measured = schemas["Measurements"]["properties"]["branched_critical_batch"]
    assert _ref(measured) == "BranchedCriticalBatch"
    point = schemas["BranchedBatchPoint"]["properties"]
    assert point["status"]["enum"] == ["measured", "at_least", "at_most", "not_measured"]
    assert {o.get("type") for o in point["critical_batch"]["anyOf"]} == {"integer", "null"}
    assert "reason" in point


def test_the_continuous_branch_estimates_are_typed_beside_the_ladder(
    schemas: dict[str, Any],
) -> None:
    estimate = schemas["BranchedBatchEstimate"]
    assert {"method", "value", "status", "formula"} <= set(estimate["required"])
    assert estimate["properties"]["method"]["enum"] == ["ladder", "efficiency_fit", "eps_crossing"]
    assert estimate["properties"]["value"]["exclusiveMinimum"] == 0
    for name in ("BranchCheckpoint", "BranchedBatchPoint"):
        props = schemas[name]["properties"]
        assert _ref(props["efficiency"]) == _ref(props["crossing"]) == "BranchedBatchEstimate"
    curve = schemas["BranchCurve"]["properties"]
    reach = next(o for o in curve["reference_reach"]["anyOf"] if "enum" in o)
    assert reach["enum"] == ["inside", "kept_up", "not_reached"]
    batch = schemas["BudgetBatch"]["properties"]
    method = next(o for o in batch["critical_method"]["anyOf"] if "enum" in o)
    assert method["enum"] == ["ladder", "efficiency_fit", "eps_crossing"]
    assert _ref(batch["branch_estimates"]) == "BranchedBatchEstimate"
