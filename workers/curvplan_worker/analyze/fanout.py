"""Block fan-out of an ``analyze`` job (docs/numerics.md#block-fan-out).

An analysis with two or more blocks splits its per-block spectra and off-diagonal pairs into
``analyze_blocks`` child jobs (gpu queue), so that N workers measure them in parallel; the
parent's fan-in attempt runs every other stage with the children's records plugged in.

Groups are balanced by *estimated cost*, not by count (:func:`block_cost`, :func:`pair_cost`),
with the greedy longest-processing-time-first rule (:func:`lpt_groups`; Graham 1969, "Bounds on
multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2), which also proves its makespan
is within 4/3 − 1/(3m) of the optimum on m machines).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from curvplan.types.options import AnalysisOptions

CHILD_KIND = "analyze_blocks"
MIN_GROUPS = 2


@dataclass(frozen=True)
class WorkItem:
    """One unit a child measures: a block (``key`` = its name) or an off-diagonal pair
    (``key`` = ``row|col``, ``pair`` = (row, col)), with its estimated cost."""

    key: str
    cost: float
    pair: tuple[str, str] | None = None


@dataclass
class Group:
    """The items one child job measures and their summed estimated cost."""

    items: list[WorkItem] = field(default_factory=list)
    cost: float = 0.0

    @property
    def blocks(self) -> list[str]:
        return [i.key for i in self.items if i.pair is None]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [i.pair for i in self.items if i.pair is not None]


def _steps(opts: AnalysisOptions, n: int) -> int:
    """Expected Lanczos steps per run: at most ``max_iter``, and at most the dimension (the
    Krylov space is exhausted after n steps; see ``spectra.lanczos_spectrum``)."""
    return max(1, min(opts.max_iter, n))


def block_products(n: int, opts: AnalysisOptions) -> int:
    """Operator products the engine spends on a block of ``n`` parameters, at most:
    λ_max and λ_min (two Lanczos ends, each up to min(max_iter, n) steps, as in
    ``spectra.block_spectrum``), the Hutch++ trace probes (``trace_probes`` products), and with
    ``ggn`` the GGN and functional parts (two more two-ended Lanczos runs each)."""
    steps = _steps(opts, n)
    products = 2 * steps + opts.trace_probes
    if opts.ggn:
        products += 2 * 2 * steps
    return products


def block_cost(n: int, opts: AnalysisOptions) -> float:
    """Estimated cost of a block: its size × its expected products (:func:`block_products`).

    Where it comes from: each Lanczos step costs one Hessian-vector product plus full
    reorthogonalisation against the previous steps, both linear in the block's size n, so the
    work of a block grows like n × products. It is an upper bound (Lanczos usually converges
    before max_iter) used only to rank and balance blocks, never reported as a time.
    """
    return float(n) * block_products(n, opts)


def pair_cost(n_rows: int, n_cols: int, opts: AnalysisOptions) -> float:
    """Estimated cost of an off-diagonal pair: (n_rows + n_cols) × expected steps.

    σ_max(H_rc) is Lanczos on H_rcᵀH_rc (``spectra.off_diagonal_norm``): each step is two
    products, H_rc v (length n_rows) and H_cr u (length n_cols), and its rank is at most
    min(n_rows, n_cols), so it needs at most min(max_iter, n_rows, n_cols) steps.
    """
    return float(n_rows + n_cols) * _steps(opts, min(n_rows, n_cols))


def work_items(
    blocks: dict[str, int], pairs: Sequence[tuple[str, str, int, int]], opts: AnalysisOptions
) -> list[WorkItem]:
    """Every block and pair of an analysis as a costed item."""
    items = [WorkItem(name, block_cost(n, opts)) for name, n in blocks.items()]
    items += [WorkItem(f"{r}|{c}", pair_cost(nr, nc, opts), (r, c)) for r, c, nr, nc in pairs]
    return items


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


def live_workers(engine: Any, queue: str, stale_seconds: float) -> int:
    """Worker slots serving ``queue`` whose heartbeat is fresh (the API's ``live``)."""
    from sqlalchemy import text

    with engine.connect() as conn:
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
    """The child's name: its place, what it measures and its estimated cost, in parameter ·
    products (a block of n parameters times the products it needs; :func:`block_cost`)."""
    what = f"{len(group.blocks)} blocks"
    if group.pairs:
        what += f", {len(group.pairs)} pairs"
    return f"blocks {index}/{total} ({what}, est. cost {group.cost:.3g} parameter·products)"
