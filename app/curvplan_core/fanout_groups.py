"""Cost-balanced groups of an analysis's block fan-out (docs/numerics.md#block-fan-out).

An analysis that fans out splits its per-block spectra and off-diagonal pairs into
``analyze_blocks`` child jobs (gpu queue), so that N workers measure them in parallel; the
parent's one attempt, its fan-in, runs every other stage with the children's records.

Groups are balanced by the cost model's estimated seconds of each block and pair
(``curvplan_core.cost_model``: the Lanczos steps, trace probes and GGN runs the options ask
for, at the products' prior milliseconds), with the greedy longest-processing-time-first rule
(:func:`lpt_groups`; Graham 1969, "Bounds on multiprocessing timing anomalies", SIAM J. Appl.
Math. 17(2), which also proves its makespan is within 4/3 − 1/(3m) of the optimum on m
machines).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, text

CHILD_KIND = "analyze_blocks"
MIN_GROUPS = 2


@dataclass(frozen=True)
class WorkItem:
    """One unit a child measures: a block (``key`` = its name) or an off-diagonal pair
    (``key`` = ``row|col``, ``pair`` = (row, col)), with its estimated cost in seconds."""

    key: str
    cost: float
    pair: tuple[str, str] | None = None


@dataclass
class Group:
    """The items one child job measures and their summed estimated seconds."""

    items: list[WorkItem] = field(default_factory=list)
    cost: float = 0.0

    @property
    def blocks(self) -> list[str]:
        return [i.key for i in self.items if i.pair is None]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [i.pair for i in self.items if i.pair is not None]


def lpt_groups(items: Sequence[WorkItem], n_groups: int) -> list[Group]:
    """Greedy longest-processing-time first (Graham 1969): items by decreasing cost, each to
    the group with the smallest total so far (ties: the lower group index, then the item key,
    so the split is deterministic). Empty groups are dropped."""
    if n_groups < 1:
        raise ValueError("n_groups must be at least 1")
    groups = [Group() for _ in range(n_groups)]
    heap = [(0.0, i) for i in range(n_groups)]
    for item in sorted(items, key=lambda it: (-it.cost, it.key)):
        load, index = heapq.heappop(heap)
        groups[index].items.append(item)
        groups[index].cost = load + item.cost
        heapq.heappush(heap, (groups[index].cost, index))
    return [g for g in groups if g.items]


def group_count(requested: int | None, live_workers: int, n_blocks: int) -> int:
    """How many children: ``fan_out_groups`` when given, else the live workers serving the
    gpu queue (at least :data:`MIN_GROUPS`); never more than the blocks."""
    wanted = requested if requested is not None else max(MIN_GROUPS, live_workers)
    return max(1, min(wanted, n_blocks))


def live_workers(conn: Connection, queue: str, stale_seconds: float) -> int:
    """Worker slots serving ``queue`` whose heartbeat is fresh (the API's ``live``)."""
    return int(
        conn.execute(
            text(
                "SELECT count(*) FROM worker WHERE status = 'running'"
                " AND :queue = ANY(queues)"
                " AND last_heartbeat_at > now() - make_interval(secs => :stale)"
            ),
            {"queue": queue, "stale": float(stale_seconds)},
        ).scalar_one()
    )


def child_name(index: int, total: int, group: Group) -> str:
    """The child's name: its place, what it measures and its estimated seconds."""
    what = f"{len(group.blocks)} blocks"
    if group.pairs:
        what += f", {len(group.pairs)} pairs"
    return f"blocks {index}/{total} ({what}, est. cost {group.cost:.3g} s)"
