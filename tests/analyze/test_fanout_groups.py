"""Block fan-out groups: the group count, and the LPT split checked against the optimal split
found by brute force (Graham's 4/3 − 1/(3m) guarantee). The groups' costs are the cost model's
seconds (tests/analyze/test_analysis_plan.py)."""

from __future__ import annotations

import itertools
import random
import uuid
from typing import Any

import pytest

from curvplan_core.fanout_groups import WorkItem, group_count, lpt_groups


def _optimal_makespan(costs: list[float], m: int) -> float:
    best = float("inf")
    for assignment in itertools.product(range(m), repeat=len(costs)):
        loads = [0.0] * m
        for cost, g in zip(costs, assignment, strict=True):
            loads[g] += cost
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("m", [2, 3])
def test_lpt_is_within_grahams_bound_of_the_optimum(m):
    rng = random.Random(m)
    for trial in range(40):
        costs = [rng.choice([1, 2, 3, 5, 8, 13]) * rng.uniform(0.5, 2) for _ in range(7)]
        items = [WorkItem(f"b{i}", c) for i, c in enumerate(costs)]
        groups = lpt_groups(items, m)
        keys = sorted(i.key for g in groups for i in g.items)
        assert keys == sorted(i.key for i in items), "every item exactly once"
        for g in groups:
            assert g.cost == pytest.approx(sum(i.cost for i in g.items))
        makespan = max(g.cost for g in groups)
        assert makespan <= (4 / 3 - 1 / (3 * m)) * _optimal_makespan(costs, m) + 1e-9, trial


def test_groups_balance_cost_not_count():
    # one large block and six small ones: by count 4/3 per group; by cost the large one alone
    items = [WorkItem("big", 60.0)] + [WorkItem(f"s{i}", 10.0) for i in range(6)]
    groups = lpt_groups(items, 2)
    big = next(g for g in groups if "big" in g.blocks)
    assert big.blocks == ["big"]
    assert sorted(g.cost for g in groups) == [60.0, 60.0]


def test_lpt_is_deterministic_and_drops_empty_groups():
    items = [WorkItem("a", 1.0), WorkItem("b", 1.0)]
    assert [g.blocks for g in lpt_groups(items, 5)] == [["a"], ["b"]]
    assert [g.blocks for g in lpt_groups(items[::-1], 5)] == [["a"], ["b"]]


def test_group_count_uses_the_request_else_live_workers_capped_by_blocks():
    assert group_count(3, live_workers=8, n_blocks=10) == 3
    assert group_count(None, live_workers=4, n_blocks=10) == 4
    assert group_count(None, live_workers=0, n_blocks=10) == 2  # at least two
    assert group_count(None, live_workers=1, n_blocks=10) == 2
    assert group_count(None, live_workers=16, n_blocks=5) == 5
    assert group_count(9, live_workers=1, n_blocks=2) == 2


SPEC = {
    "d_model": 16,
    "n_heads": 2,
    "d_ff": 32,
    "n_layers": 1,
    "task": {"type": "causal_lm", "vocab_size": 11, "seq_len": 6},
}


def _child_record(
    id_: str, status: str, blocks: list[str], pairs: list[list[str]], result: Any, error: Any
) -> dict[str, Any]:
    """A child row as ``curvplan_core.jobs.fanout.children_of`` reads it (JSON columns)."""
    from curvplan.types.jobs import AnalyzeBlocksJobCreate

    request = AnalyzeBlocksJobCreate(
        kind="analyze_blocks",
        model=SPEC,
        checkpoint=uuid.uuid4(),
        dataset=uuid.uuid4(),
        blocks=blocks,
        pairs=[(r, c) for r, c in pairs],
        estimated_cost=2.5,
    )
    return {
        "id": id_,
        "kind": "analyze_blocks",
        "name": f"blocks of {id_}",
        "status": status,
        "request": request.model_dump(mode="json", exclude_none=True),
        "result": result,
        "error": error,
        "attempt": 3 if error else 1,
    }


#: A block record as a child's engine wrote it: typed fields, a nested trace, a field the
#: result model does not name, and integral floats.
EMBED = {
    "name": "embed",
    "params": ["embed.weight"],
    "lambda_max": 2.0,
    "trace": {"value": 1.5, "stderr": 0.25, "method": "hutch++"},
    "lanczos": {"steps": 12, "restarts": 0},
    "converged": True,
}


def _typed(records: list[dict[str, Any]], model: Any = None) -> list[Any]:
    from curvplan.types.jobs import AnalyzeBlocksJobCreate
    from curvplan.types.results import AnalyzeBlocksResult
    from curvplan_worker.job_context import ChildOutcome

    return [
        ChildOutcome.parse(r, AnalyzeBlocksJobCreate, AnalyzeBlocksResult, model) for r in records
    ]


def test_a_failed_child_fails_the_fan_in_naming_its_blocks_and_pairs():
    from curvplan_worker.analyze.pipeline import _fanned_in
    from curvplan_worker.errors import JobError

    result = {"measurements": {"blocks": [EMBED], "off_diagonal": [], "elapsed_s": 4.0}}
    ok = _child_record("c1", "succeeded", ["embed"], [], result, None)
    failed = _child_record(
        "c2", "failed", ["head", "layers.0.q"], [["head", "embed"]], None, {"type": "out-of-memory"}
    )
    with pytest.raises(JobError) as caught:
        _fanned_in(_typed([ok, failed]))
    error = caught.value
    assert error.type == "block-group-failed"
    assert "['head', 'layers.0.q']" in error.detail and "head|embed" in error.detail
    assert "out-of-memory" in error.detail and "c1" not in error.detail  # only the failed one
    measured, record = _fanned_in(_typed([ok]))
    # the engine gets each block record as the child's engine wrote it
    assert [b.model_dump(exclude_unset=True) for b in measured.blocks] == [EMBED]
    assert measured.off_diagonal == []
    [child] = record.model_dump()["children"]
    assert child == {
        "job_id": "c1",
        "name": "blocks of c1",
        "blocks": ["embed"],
        "pairs": [],
        "estimated_cost": 2.5,
        "elapsed_s": 4.0,
        "attempt": 1,
    }


def test_the_children_are_parsed_once_into_their_kinds_types_reusing_the_parents_model():
    from curvplan.types.jobs import AnalyzeBlocksJobCreate, JobError
    from curvplan.types.results import AnalyzeBlocksResult
    from curvplan.types.spec import ModelSpec

    result = {"measurements": {"blocks": [EMBED]}, "estimated_cost": 2.5}
    records = [
        _child_record("c1", "succeeded", ["embed"], [], result, None),
        _child_record("c2", "failed", ["head"], [], None, {"type": "worker-lost", "title": "t"}),
        _child_record("c3", "succeeded", ["q"], [], {}, None),  # no result: not a success
    ]
    parent = ModelSpec.model_validate(SPEC)
    ok, lost, empty = _typed(records, parent)
    assert isinstance(ok.request, AnalyzeBlocksJobCreate) and ok.request.blocks == ["embed"]
    assert isinstance(ok.result, AnalyzeBlocksResult) and ok.succeeded
    assert ok.result.measurements.blocks is not None
    assert ok.result.measurements.blocks[0].trace is not None
    assert ok.result.measurements.blocks[0].trace.value == 1.5
    assert lost.error == JobError(type="worker-lost", title="t") and not lost.succeeded
    assert not empty.succeeded and empty.result is None
    # the children carry their parent's model: its object, not a second parse of the spec
    assert all(c.request.model is parent for c in (ok, lost, empty))
    other = ModelSpec.model_validate({**SPEC, "d_ff": 64})
    [alone] = _typed(records[:1], other)  # not the parent's: parsed from the child's own JSON
    assert alone.request.model is not other and alone.request.model == parent
