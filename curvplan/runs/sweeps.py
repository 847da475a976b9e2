"""``measurements.batch_sweeps`` from runs at several training-set sizes: one steps-to-target
table per token count, for the batch scaling law B_crit(D) = c·D^γ the planner fits
(docs/budget.md#batch; docs/integrations.md#pilot-runs-from-a-tracker).

Which tables qualify is decided by the plan's own input models (``BatchSweep``,
``Measurements.batch_sweeps``), so the import and the planner cannot disagree on it.
Torch-free and numpy-free (pydantic only, like ``curvplan.types``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NotRequired, TypedDict

from pydantic import BaseModel, ValidationError

from curvplan.types.planner import BatchSweep, Measurements

SWEEPS_TABLE: Final = "batch_sweeps"
#: The law is in tokens: a size known in examples only needs this option (or a tokens param).
TOKENS_OPTION = "--tokens-per-example N"
#: Stands in for an unknown token count when only a group's table is checked.
_ANY_TOKENS = 1.0


@dataclass(frozen=True)
class SizeGroup:
    """The runs on one training-set size that reached the target: their steps-to-target rows
    (``batch_size``, ``steps``, ``steps_uncertainty``), one per batch size."""

    tokens: float | None
    examples: float | None
    rows: Sequence[Mapping[str, float]]

    @property
    def label(self) -> str:
        if self.tokens is not None:
            return f"{self.tokens:g} tokens"
        if self.examples is not None:
            return f"{self.examples:g} examples"
        return "an unknown training-set size"

    @property
    def batch_sizes(self) -> list[int]:
        return [int(row["batch_size"]) for row in self.rows]


class GroupJson(TypedDict):
    """A size group's outcome in the import report."""

    tokens: float | None
    examples: float | None
    batch_sizes: list[int]
    sent: bool
    reason: NotRequired[str]


class BatchSweepJson(TypedDict):
    """One entry of ``measurements.batch_sweeps`` (``curvplan.types.planner.BatchSweep``)."""

    tokens: float | None
    steps_to_target: list[Mapping[str, float]]


@dataclass(frozen=True)
class GroupOutcome:
    """Whether a size's table went into ``batch_sweeps``, and why not."""

    group: SizeGroup
    sent: bool
    reason: str | None = None

    def as_json(self) -> GroupJson:
        out: GroupJson = {
            "tokens": self.group.tokens,
            "examples": self.group.examples,
            "batch_sizes": self.group.batch_sizes,
            "sent": self.sent,
        }
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class SweepsResult:
    """``sweeps`` (None: not sent, ``note`` says why) and every size group's outcome."""

    sweeps: list[BatchSweepJson] | None
    groups: list[GroupOutcome]
    note: str | None


def _problem(model: type[BaseModel], data: Mapping[str, Any]) -> str | None:
    """The model's validation errors as one line (``loc: message; …``), or None."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
    return None


def _group_problem(group: SizeGroup) -> str | None:
    """Why the group's table cannot be a batch sweep (``BatchSweep``: 3 or more distinct batch
    sizes, …), or None. A size known in examples only has its table checked alone."""
    tokens = group.tokens if group.tokens is not None else _ANY_TOKENS
    problem = _problem(BatchSweep, {"tokens": tokens, "steps_to_target": list(group.rows)})
    if problem is None:
        return None
    count = len(group.rows)
    return f"{count} batch size{'s' if count != 1 else ''} reached the target: {problem}"


def build_batch_sweeps(
    groups: Sequence[SizeGroup], *, target_tokens: float | None
) -> SweepsResult | None:
    """One batch sweep per token count (``{"tokens": D, "steps_to_target": rows}``, sorted by
    D) for the law B_crit(D) = c·D^γ of Zhang et al. 2024 (arXiv 2410.21676) and Bergsma et al.
    2025 (arXiv 2505.13738), fitted by the planner; sent when 2 or more sizes in tokens give a
    table the plan accepts. None when the law is not in question: fewer than 2 sizes give a
    table and no target run (``target_tokens``) was asked for."""
    problems = [_group_problem(g) for g in groups]
    fittable = [g for g, p in zip(groups, problems, strict=True) if p is None]
    if len(fittable) < 2 and target_tokens is None:
        return None
    in_tokens = sorted((g for g in fittable if g.tokens is not None), key=lambda g: g.tokens or 0)
    in_examples = [g for g in fittable if g.tokens is None and g.examples is not None]
    reasons: dict[int, str] = {}
    for group, problem in zip(groups, problems, strict=True):
        if problem is not None:
            reasons[id(group)] = problem
        elif group.tokens is None and group.examples is not None:
            reasons[id(group)] = (
                f"its size is in examples only ({group.examples:g} examples) and the tokens per "
                f"example are unknown: the law is in tokens; give {TOKENS_OPTION}"
            )
        elif group.tokens is None:
            reasons[id(group)] = "its runs have no training-set size"
    note: str | None = None
    sweeps: list[BatchSweepJson] | None = None
    if len(in_tokens) >= 2:
        sweeps = [{"tokens": g.tokens, "steps_to_target": list(g.rows)} for g in in_tokens]
        problem = _problem(Measurements, {SWEEPS_TABLE: sweeps})
        if problem is not None:
            note = f"the plan would refuse the sweeps: {problem}"
            sweeps = None
    else:
        note = (
            "the batch scaling law needs steps-to-target tables at 2 or more token counts; "
            f"{len(in_tokens)} usable"
        )
        if in_examples:
            note += (
                f" and {len(in_examples)} more at sizes known in examples only: the law is "
                f"in tokens; give {TOKENS_OPTION} (or map a tokens param: --param tokens=NAME)"
            )
    if sweeps is None:
        for group in in_tokens:
            reasons.setdefault(id(group), note or "not sent")
    outcomes = [GroupOutcome(g, id(g) not in reasons, reasons.get(id(g))) for g in groups]
    return SweepsResult(sweeps, outcomes, note)
