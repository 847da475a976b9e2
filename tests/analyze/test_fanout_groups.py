"""Block fan-out groups: the group count, and the LPT split checked against the optimal split
found by brute force (Graham's 4/3 − 1/(3m) guarantee). The groups' costs are the cost model's
seconds (tests/analyze/test_analysis_plan.py)."""

from __future__ import annotations

import itertools
import random

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


def test_a_failed_child_fails_the_fan_in_naming_its_blocks_and_pairs():
    from curvplan_worker.analyze.pipeline import _fanned_in
    from curvplan_worker.errors import JobError

    ok = {
        "id": "c1",
        "name": "blocks 1/2",
        "status": "succeeded",
        "request": {"blocks": ["embed"], "pairs": []},
        "result": {"measurements": {"blocks": [{"name": "embed"}], "off_diagonal": []}},
        "error": None,
        "attempt": 1,
    }
    failed = {
        "id": "c2",
        "name": "blocks 2/2",
        "status": "failed",
        "request": {"blocks": ["head", "layers.0.q"], "pairs": [["head", "embed"]]},
        "result": None,
        "error": {"type": "out-of-memory"},
        "attempt": 3,
    }
    with pytest.raises(JobError) as caught:
        _fanned_in([ok, failed])
    error = caught.value
    assert error.type == "block-group-failed"
    assert "['head', 'layers.0.q']" in error.detail and "head|embed" in error.detail
    assert "out-of-memory" in error.detail and "c1" not in error.detail  # only the failed one
    measured, record = _fanned_in([ok])
    assert measured.blocks == [{"name": "embed"}] and record["children"][0]["job_id"] == "c1"
