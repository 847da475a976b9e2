"""The ``sweep`` kind: fan out one ``sweep_point`` per training run, then fit (no torch).

First attempt (fan-out): validate, read the training data's size from its safetensors
header, and return the points as child jobs. Fan-in attempt (``ctx.children`` set): fit
the finished points with the planner. A failed point leaves the fit to the others when
enough remain (3 for a batch sweep, 4 subset sizes for a data sweep); the result names the
failed ones. A data sweep trains every subset at every multiplier of ``optimizer.lr_grid``
with a decayed schedule over its own steps (``data_steps``) and keeps one run per subset by
``DATA_LR_RULE``; its fan-in may return another round of points instead of a result, while
the target is not bracketed (``curvplan_core.planner.data_rounds``). A branch sweep
trains one point per checkpoint and batch size over the same token window and takes the CBS
of each checkpoint (``curvplan_worker.sweep.branch``; a failed branch counts as not keeping
up, a failed reference branch leaves its checkpoint without a CBS).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from curvplan.types.jobs import SweepJobCreate, SweepPointJobCreate
from curvplan.types.planner import (
    BatchSizeSection,
    BCrit,
    LossPoint,
    Measurements,
    NotComputed,
    Recommendation,
    StepsPoint,
    Targets,
)
from curvplan.types.results import SweepJobResult, SweepPointJobResult
from curvplan.types.sweep import (
    MIN_POINTS,
    BatchSweepFit,
    DataSweepFit,
    DataSweepRound,
    NoiseScaleAtLoss,
    PointResult,
    PointSettings,
    SweepPointOut,
    SweepResult,
    SweepSettings,
    data_steps,
)
from curvplan_core.artifacts.safetensors_format import validate_file
from curvplan_core.planner import make_plan
from curvplan_core.planner.budget_section import sweep_steps_rule
from curvplan_core.planner.data_rounds import NextRound, next_round
from curvplan_core.planner.gradient_noise import ratio_of_means_bootstrap, two_batch_estimates
from curvplan_worker.analyze.artifacts import attempt_access
from curvplan_worker.analyze.pipeline import checkpoint_step
from curvplan_worker.analyze.sweep_inputs import LossRow, StepsRow, SweepMeasurements
from curvplan_worker.errors import JobError
from curvplan_worker.job_context import ChildJob, ChildOutcome, FanOut, JobContext
from curvplan_worker.kinds.plan import seed_for_job
from curvplan_worker.sweep.branch import fit_branches, plan_branches
from curvplan_worker.sweep.ladder import batch_ladder, checked_batch_ladder
from curvplan_worker.sweep.lr import interpolated_multiplier, lr_for_batch

DATA_SIZE_STEPS = 6  # default data sweep: N, N/2, …, N/32
B_SIMPLE_FORMULA = (
    "B_simple = mean_t tr Σ_t / mean_t |G|²_t with |G|²_t = (B|G_B|² − b|G_b|²)/(B − b), "
    "tr Σ_t = (|G_b|² − |G_B|²)/(1/b − 1/B), b = B/2 (McCandlish et al. 2018, App. A)"
)
TARGET_BAND = 0.2
"""B_simple at the target pools the steps whose window started within 20 % of the
(start − target) loss gap above the target."""


def run(body: SweepJobCreate, ctx: JobContext) -> SweepJobResult | FanOut:
    if ctx.children is None:
        return _fan_out(body, ctx)
    return _fan_in(body, ctx)


# --------------------------------------------------------------------------- fan-out
def _inputs(body: SweepJobCreate, ctx: JobContext) -> tuple[int, list[int | None]]:
    """The training data's size, and the step of each branch checkpoint (the request's
    ``sweep.checkpoint_steps``, else what each checkpoint file declares)."""
    with attempt_access(ctx) as (access, project_id):
        art = access.resolve(project_id, str(body.train_data), "dataset", "train_data")
        access.resolve(project_id, str(body.eval_data), "dataset", "eval_data")
        if body.checkpoint is not None:
            access.resolve(project_id, str(body.checkpoint), "checkpoint", "checkpoint")
        branch_paths = [
            str(access.resolve(project_id, str(c), "checkpoint", f"checkpoints.{i}").path)
            for i, c in enumerate(body.checkpoints)
        ]
        info = validate_file(str(art.path))
        declared = body.sweep.checkpoint_steps
        steps: list[int | None] = (
            list(declared) if declared is not None else [checkpoint_step(p) for p in branch_paths]
        )
    # the engine's `inputs`, or a Hugging Face model's `input_ids`: one row per example
    inputs = info.tensors.get("inputs", info.tensors.get("input_ids"))
    if inputs is None or not inputs.shape:
        raise JobError(
            "invalid-dataset", "Invalid training data", "train_data: no inputs or input_ids tensor"
        )
    return int(inputs.shape[0]), steps


def plan_points(
    body: SweepJobCreate, n_train: int | None, steps: Sequence[int | None] | None = None
) -> list[ChildJob[SweepPointJobCreate]]:
    """The sweep's runs as child jobs (one per batch size, × lr multipliers for the grid rule;
    one per subset size for a data sweep; one per checkpoint and batch size for a branch
    sweep, ``steps`` being the checkpoints' training steps). ``n_train`` is the training
    data's size, None for an agent sweep (the agents' command has its own data: the sizes
    are not checked against it)."""
    sweep, opt = body.sweep, body.optimizer
    children: list[ChildJob[SweepPointJobCreate]] = []

    def child(name: str, point: PointSettings) -> ChildJob[SweepPointJobCreate]:
        request = SweepPointJobCreate(
            kind="sweep_point",
            runner=body.runner,
            model=body.model,
            checkpoint=body.checkpoint,
            train_data=body.train_data,
            eval_data=body.eval_data,
            optimizer=body.optimizer,
            point=point,
        )
        return ChildJob(request=request, name=name)

    if sweep.type == "branch":
        assert n_train is not None  # an agent sweep is a batch or data sweep (the contract)
        return plan_branches(
            body,
            n_train,
            list(steps) if steps is not None else [None] * len(body.checkpoints),
            lambda name, request: ChildJob(request=request, name=name),
        )
    if sweep.type == "batch":
        sizes = batch_ladder(sweep) if n_train is None else checked_batch_ladder(sweep, n_train)
        multipliers = opt.lr_grid if opt.lr_rule == "grid" else [1.0]
        for b in sizes:
            for m in multipliers:
                lr = lr_for_batch(opt, b, m)
                suffix = f", lr×{m:g}" if opt.lr_rule == "grid" else ""
                point = PointSettings(
                    type="batch",
                    batch_size=b,
                    lr=lr,
                    lr_multiplier=m,
                    target_loss=sweep.target_loss,
                    max_steps=sweep.max_steps,
                    eval_every=sweep.eval_every,
                    seed=sweep.init_seed,
                )
                children.append(child(f"B={b}{suffix}", point))
        return children
    if sweep.data_sizes is None:
        assert n_train is not None  # an agent data sweep names its sizes (the contract)
    sizes = sorted(set(sweep.data_sizes or _default_data_sizes(n_train or 0, sweep.batch_size)))
    too_big = [d for d in sizes if n_train is not None and d > n_train]
    if too_big:
        raise JobError(
            "invalid-request",
            "Invalid sweep request",
            f"sweep.data_sizes: {too_big} exceed the training data ({n_train} examples)",
        )
    runs = len(sizes) * len(opt.lr_grid)
    if runs > sweep.max_runs:
        raise JobError(
            "invalid-request",
            "Invalid sweep request",
            f"sweep.max_runs: the first round alone is {runs} runs ({len(sizes)} sizes × "
            f"{len(opt.lr_grid)} lr-grid multipliers); raise max_runs or give fewer sizes",
        )
    return data_round_points(body, sizes, 1)


def data_round_points(
    body: SweepJobCreate, sizes: Sequence[int], round_number: int
) -> list[ChildJob[SweepPointJobCreate]]:
    """One round of a data sweep: every size at every lr-grid multiplier, each run the steps
    of the epoch rule (:func:`curvplan.types.sweep.data_steps`) with its decayed schedule over
    exactly those steps. Every subset runs at every multiplier: the runs the end-tuned lr rule
    needs for the middle subsets are not known before the ends have finished."""
    sweep, opt = body.sweep, body.optimizer
    children = []
    for d in sizes:
        steps = data_steps(d, sweep.batch_size, sweep.epochs, sweep.min_steps, sweep.max_steps)
        for m in opt.lr_grid:
            point = PointSettings(
                type="data",
                batch_size=sweep.batch_size,
                lr=lr_for_batch(opt, sweep.batch_size, m),
                lr_multiplier=m,
                data_size=d,
                target_loss=sweep.target_loss,
                max_steps=steps,
                eval_every=min(sweep.eval_every, steps),
                patience=sweep.patience,
                seed=sweep.init_seed,
                schedule=sweep.schedule,
                cooldown_fraction=sweep.cooldown_fraction,
                round=round_number,
            )
            suffix = f", lr×{m:g}" if len(opt.lr_grid) > 1 else ""
            request = SweepPointJobCreate(
                kind="sweep_point",
                runner=body.runner,
                model=body.model,
                checkpoint=body.checkpoint,
                train_data=body.train_data,
                eval_data=body.eval_data,
                optimizer=body.optimizer,
                point=point,
            )
            children.append(ChildJob(request=request, name=f"D={d}{suffix}"))
    return children


def data_schedule_text(settings: SweepSettings) -> str:
    """The data sweep's training protocol, in words (result and docs)."""
    if settings.schedule == "cosine":
        decay = "cosine decay to 0 (Loshchilov & Hutter 2017)"
    else:
        decay = (
            f"warmup-stable-decay with a 1−sqrt cooldown over the last "
            f"{settings.cooldown_fraction:.0%} of the steps (Hägele et al. 2024)"
        )
    return (
        f"every subset trained at batch {settings.batch_size} for its own steps "
        f"({sweep_steps_rule(settings)}): linear warm-up, then {decay} over those steps; L(D) "
        f"is the best held-out loss, evaluated every {settings.eval_every} steps"
    )


DATA_LR_RULE = (
    "lr = base lr × m; m from the grid {grid}: the best held-out loss on the smallest and on the "
    "largest subset, log-linear in log D between them for the other subsets (the nearest grid "
    "run is used)"
)


def select_data_runs(
    results: list[tuple[SweepPointOut, PointResult]],
) -> tuple[list[tuple[SweepPointOut, PointResult]], dict[int, float]]:
    """One run per subset size by the stated rule (``DATA_LR_RULE``): the grid multiplier with
    the lowest best held-out loss is chosen on the smallest and on the largest subset only;
    a subset in between uses the run whose multiplier is nearest in log to the log-linear
    interpolation (``interpolated_multiplier``). Choosing on the end subsets only keeps the
    middle points free of a per-point selection on the evaluation data."""
    by_size: dict[int, list[tuple[SweepPointOut, PointResult]]] = {}
    for out, r in results:
        if r.data_size is not None:
            by_size.setdefault(r.data_size, []).append((out, r))
    if not by_size:
        return [], {}
    sizes = sorted(by_size)
    best_end = {
        d: min(by_size[d], key=lambda pr: pr[1].best_eval_loss)[1].lr_multiplier
        for d in (sizes[0], sizes[-1])
    }
    chosen: list[tuple[SweepPointOut, PointResult]] = []
    multipliers: dict[int, float] = {}
    for d in sizes:
        want = interpolated_multiplier(
            (sizes[0], sizes[-1]), (best_end[sizes[0]], best_end[sizes[-1]]), d
        )
        pick = min(by_size[d], key=lambda pr: abs(math.log(pr[1].lr_multiplier / want)))
        for out, _ in by_size[d]:
            if out is not pick[0]:
                out.excluded_reason = (
                    f"the lr rule chose ×{pick[1].lr_multiplier:g} for this subset size"
                )
        pick[0].used_in_fit = True
        pick[0].excluded_reason = None
        chosen.append(pick)
        multipliers[d] = pick[1].lr_multiplier
    return chosen, multipliers


def _default_data_sizes(n_train: int, batch_size: int) -> list[int]:
    sizes = [n_train // 2**k for k in range(DATA_SIZE_STEPS)]
    return [d for d in sizes if d >= max(2, batch_size)]


def _fan_out(body: SweepJobCreate, ctx: JobContext) -> FanOut:
    if body.runner == "agent":  # the agents' command has its own data
        n_train: int | None = None
        steps: list[int | None] = []
    else:
        ctx.report_progress(0.0, "planning points", "reading the training data")
        n_train, steps = _inputs(body, ctx)
    children = plan_points(body, n_train, steps)
    distinct = (
        len({c.request.point.data_size for c in children})
        if body.sweep.type == "data"
        else len({c.request.point.batch_size for c in children})
    )
    if distinct < MIN_POINTS[body.sweep.type]:
        raise JobError(
            "invalid-request",
            "Invalid sweep request",
            f"sweep: {distinct} points; a {body.sweep.type} sweep needs at least "
            f"{MIN_POINTS[body.sweep.type]} to fit",
        )
    ctx.report_progress(0.01, "planning points", f"{len(children)} points")
    waits = " for `curvplan agent`" if body.runner == "agent" else ""
    return FanOut(children=children, message=f"{len(children)} training runs{waits}")


# --------------------------------------------------------------------------- fan-in
def _fan_in(body: SweepJobCreate, ctx: JobContext) -> SweepJobResult | FanOut:
    ctx.report_progress(0.0, "fitting", f"{len(ctx.children or [])} points")
    children = ctx.children_as(SweepPointJobCreate, SweepPointJobResult, body.model)
    sweep = body.sweep
    outs: list[SweepPointOut] = []
    results: list[tuple[SweepPointOut, PointResult]] = []
    failed = []
    for child in children:
        result = child.result.point if child.succeeded and child.result is not None else None
        point_out = SweepPointOut(
            job_id=child.id,
            name=child.name,
            status=child.status,
            used_in_fit=False,
            error_type=child.error.type if child.error is not None else None,
            result=result,
        )
        if result is None:
            point_out.excluded_reason = f"the point's job {child.status}"
            failed.append(child.name or child.id)
        outs.append(point_out)
        if result is not None:
            results.append((point_out, result))
    tokens = next(
        (r.batch_size_tokens / r.batch_size for _, r in results if r.batch_size_tokens), None
    )
    seed = seed_for_job(ctx.job_id)
    answer = SweepResult(
        type=sweep.type,
        target_loss=sweep.target_loss,
        optimizer=body.optimizer,
        tokens_per_example=tokens,
        points=outs,
        points_total=len(children),
        points_used=0,
        failed_points=failed,
    )
    measurements = SweepMeasurements()
    if sweep.type == "branch":
        answer.branch, branched = fit_branches(body, children, {o.job_id: o for o in outs}, tokens)
        answer.points_used = sum(o.used_in_fit for o in outs)
        measurements["branched_critical_batch"] = branched.model_dump(mode="json")
        if tokens is not None:
            measurements["tokens_per_example"] = tokens
        recommendation = make_plan(
            Measurements(branched_critical_batch=branched, tokens_per_example=tokens),
            Targets(),
            seed=seed,
        )
    elif sweep.type == "batch":
        used = _best_per_batch(results)
        if len(used) < MIN_POINTS["batch"]:
            raise JobError(
                "too-few-points",
                "Too few sweep points reached the target",
                f"{len(used)} of {len(children)} points reached target_loss "
                f"{sweep.target_loss} (failed: {failed or 'none'}; censored: "
                f"{[o.name for o, r in results if r.censored]}); the fit needs "
                f"{MIN_POINTS['batch']}: raise sweep.max_steps or the target loss",
            )
        table = [StepsPoint(batch_size=r.batch_size, steps=max(r.steps, 1e-9)) for _, r in used]
        recommendation = make_plan(
            Measurements(steps_to_target=table, tokens_per_example=tokens),
            Targets(target_loss=sweep.target_loss),
            seed=seed,
        )
        batch = recommendation.batch_size
        fit: BCrit | NotComputed = batch.b_crit if isinstance(batch, BatchSizeSection) else batch
        b_crit_value = getattr(fit, "value", None)
        answer.batch = BatchSweepFit(
            fit=fit,
            b_crit_tokens=None if tokens is None or b_crit_value is None else b_crit_value * tokens,
            steps_at=table,
            n_points=len(table),
        )
        answer.points_used = len(used)
        measurements["steps_to_target"] = [
            StepsRow(batch_size=p.batch_size, steps=p.steps, steps_uncertainty=p.steps_uncertainty)
            for p in table
        ]
        answer.b_simple_at_target, answer.b_simple_trend = _noise_scales(
            [r for _, r in results if not r.censored] or [r for _, r in results],
            sweep.target_loss or 0.0,
            tokens,
            seed,
        )
    else:
        rounds = sorted({c.request.point.round for c in children})
        sizes_cache: list[int] = []

        def n_train() -> int:  # read once, and only when a round above is asked for
            if not sizes_cache:
                sizes_cache.append(
                    max(sweep.data_sizes or [0])  # an agent's data: as large as it named
                    if body.runner == "agent"
                    else _inputs(body, ctx)[0]
                )
            return sizes_cache[0]

        good, multipliers, recommendation, further = _data_decision(body, results, n_train, seed)
        if len(good) < MIN_POINTS["data"]:
            raise JobError(
                "too-few-points",
                "Too few sweep points finished",
                f"{len(good)} of {len(children)} points finished (failed: {failed}); the "
                f"L(D) fit with intervals needs {MIN_POINTS['data']}",
            )
        queued = _next_round(body, children, rounds, further)
        if queued is not None:
            ctx.report_progress(1.0, "next round", queued.message)
            return queued
        loss_vs_data = [
            LossPoint(n_samples=float(r.data_size or 0), loss=r.best_eval_loss) for _, r in good
        ]
        answer.data = DataSweepFit(
            fit=recommendation.scaling,
            loss_vs_data=loss_vs_data,
            n_points=len(good),
            schedule=data_schedule_text(sweep),
            lr_rule=DATA_LR_RULE.format(grid=body.optimizer.lr_grid),
            lr_multipliers={str(d): m for d, m in multipliers.items()},
            steps_rule=sweep_steps_rule(sweep),
            steps_per_size={
                str(c.request.point.data_size): c.request.point.max_steps for c in children
            },
            capped_sizes=_capped_sizes(sweep, children),
            rounds=_rounds(body, children, results, rounds, n_train, seed),
            bracketed=_bracketed(recommendation),
            next_round_sizes=None if further is None or not further.sizes else further.sizes,
        )
        if answer.data.capped_sizes:
            answer.notes.append(
                f"sizes {answer.data.capped_sizes} asked the epoch rule for more than "
                f"sweep.max_steps ({sweep.max_steps:,}) steps and trained to the cap: their "
                "L(D) may sit above the converged value; raise max_steps"
            )
        if further is not None:
            answer.notes.append(
                f"the target is not bracketed: {further.reason}; "
                + (
                    f"a next round would train {further.sizes} but the sweep's caps stop it "
                    f"(max_rounds {sweep.max_rounds}, max_runs {sweep.max_runs}; "
                    f"{len(children)} runs in {len(rounds)} round(s))"
                    if further.sizes
                    else "no next round can be trained"
                )
            )
        answer.points_used = len(good)
        measurements["loss_vs_data"] = [
            LossRow(n_samples=p.n_samples, loss=p.loss) for p in loss_vs_data
        ]
    if failed:
        answer.notes.append(
            f"{len(failed)} point(s) failed and were left out: {', '.join(map(str, failed))}; "
            f"the fit uses the {answer.points_used} remaining"
        )
    ctx.report_progress(1.0, "done", "sweep fitted")
    return SweepJobResult(
        sweep=answer, measurements=dict(measurements), recommendation=recommendation
    )


DataChildren = Sequence[ChildOutcome[SweepPointJobCreate, SweepPointJobResult]]


def _data_decision(
    body: SweepJobCreate,
    results: list[tuple[SweepPointOut, PointResult]],
    n_train: Callable[[], int],
    seed: int,
) -> tuple[
    list[tuple[SweepPointOut, PointResult]], dict[int, float], Recommendation, NextRound | None
]:
    """The data sweep's fit over ``results`` (one run per size by ``DATA_LR_RULE``) and the
    next round it asks for (``curvplan_core.planner.data_rounds.next_round``; None: the
    target is bracketed, or there is no target). A function of the stored results alone, so
    that a fan-in run again after a crash decides the same."""
    sweep = body.sweep
    good, multipliers = select_data_runs(results)
    loss_vs_data = [
        LossPoint(n_samples=float(r.data_size or 0), loss=r.best_eval_loss) for _, r in good
    ]
    tokens = next(
        (r.batch_size_tokens / r.batch_size for _, r in results if r.batch_size_tokens), None
    )
    recommendation = make_plan(
        Measurements(loss_vs_data=loss_vs_data or None, tokens_per_example=tokens),
        Targets(target_loss=sweep.target_loss),
        seed=seed,
    )
    if len(good) < MIN_POINTS["data"] or sweep.target_loss is None:
        return good, multipliers, recommendation, None
    d_star = _fitted_size(recommendation)
    sizes, losses = [p.n_samples for p in loss_vs_data], [p.loss for p in loss_vs_data]
    further = next_round(
        sizes,
        losses,
        sweep.target_loss,
        d_star,
        min_size=max(2, sweep.batch_size),
        per_round=sweep.round_sizes,
    )
    if further is not None and further.side == "above":  # no larger subset than the data
        further = next_round(
            sizes,
            losses,
            sweep.target_loss,
            d_star,
            min_size=max(2, sweep.batch_size),
            max_size=n_train(),
            per_round=sweep.round_sizes,
        )
    return good, multipliers, recommendation, further


def _next_round(
    body: SweepJobCreate, children: DataChildren, rounds: list[int], further: NextRound | None
) -> FanOut | None:
    """The next round's points, when one is needed and the caps allow it: at most
    ``max_rounds`` rounds and ``max_runs`` runs in all (a round is trimmed to the sizes
    nearest the measured ones that fit)."""
    sweep = body.sweep
    if further is None or not further.sizes or len(rounds) >= sweep.max_rounds:
        return None
    room = (sweep.max_runs - len(children)) // len(body.optimizer.lr_grid)
    if room <= 0:
        return None
    sizes = further.sizes[:room] if further.side == "above" else further.sizes[-room:]
    points = data_round_points(body, sizes, max(rounds) + 1)
    return FanOut(
        children=points,
        message=f"round {max(rounds) + 1}: {len(points)} training runs at sizes {sizes} "
        f"({further.reason})",
    )


def _rounds(
    body: SweepJobCreate,
    children: DataChildren,
    results: list[tuple[SweepPointOut, PointResult]],
    rounds: list[int],
    n_train: Callable[[], int],
    seed: int,
) -> list[DataSweepRound]:
    """The rounds run, each with why it was queued (recomputed from the rounds before it)."""
    out = []
    by_id = {c.id: c.request.point.round for c in children}
    for k in rounds:
        of_round = [c for c in children if c.request.point.round == k]
        reason = "the first round: sweep.data_sizes (default: halvings of the training data)"
        if k > 1:
            before = [(o.model_copy(), r) for o, r in results if by_id.get(o.job_id, 1) < k]
            further = _data_decision(body, before, n_train, seed)[3]
            reason = further.reason if further is not None else "(no longer needed)"
        out.append(
            DataSweepRound(
                round=k,
                data_sizes=sorted({int(c.request.point.data_size or 0) for c in of_round}),
                runs=len(of_round),
                reason=reason,
            )
        )
    return out


def _capped_sizes(sweep: SweepSettings, children: DataChildren) -> list[int]:
    """Sizes whose epoch rule asked for more steps than ``sweep.max_steps``."""
    return sorted(
        {
            d
            for c in children
            if (d := c.request.point.data_size) is not None
            and data_steps(d, sweep.batch_size, sweep.epochs, sweep.min_steps, 10**12)
            > sweep.max_steps
        }
    )


def _fitted_size(recommendation: Recommendation) -> float | None:
    """budget.data's size for the target, measured or extrapolated (None: no size)."""
    data = recommendation.budget.data if recommendation.budget is not None else None
    if data is None or data.source not in ("data_sweep", "extrapolated"):
        return None
    n = data.recommended_examples
    return None if n is None else float(n)


def _bracketed(recommendation: Recommendation) -> bool | None:
    """The fitted size for the target within 1.5× of the measured sizes, i.e. budget.data
    answers from the sweep rather than extrapolating (None: no size)."""
    if _fitted_size(recommendation) is None:
        return None
    assert recommendation.budget is not None
    return recommendation.budget.data.source == "data_sweep"


def _best_per_batch(
    results: list[tuple[SweepPointOut, PointResult]],
) -> list[tuple[SweepPointOut, PointResult]]:
    """Uncensored points, one per batch size: the fewest steps (the grid rule keeps the best
    learning rate); censored and worse-lr points are marked excluded."""
    best: dict[int, tuple[SweepPointOut, PointResult]] = {}
    for out, r in results:
        if r.censored:
            out.excluded_reason = "censored: hit the step cap before the target loss"
            continue
        current = best.get(r.batch_size)
        if current is None or r.steps < current[1].steps:
            if current is not None:
                current[0].excluded_reason = "a better learning rate reached the target sooner"
            best[r.batch_size] = (out, r)
        else:
            out.excluded_reason = "a better learning rate reached the target sooner"
    for out, _ in best.values():
        out.used_in_fit = True
        out.excluded_reason = None
    return [best[b] for b in sorted(best)]


def _noise_scales(
    points: list[PointResult], target: float, tokens: float | None, seed: int
) -> tuple[NoiseScaleAtLoss | None, list[NoiseScaleAtLoss]]:
    """Two-batch B_simple pooled over the runs' steps, per band of evaluation loss, and at
    the band just above the target loss."""
    rows: list[tuple[float, float, float]] = []  # (window start loss, |G|²_t, tr Σ_t)
    for p in points:
        tb = p.two_batch
        if tb is None:
            continue
        for loss, small, big in zip(
            tb.window_eval_losses, tb.grad_sq_norm_small, tb.grad_sq_norm_big, strict=True
        ):
            g2, tr = two_batch_estimates(tb.b_small, tb.b_big, np.array(small), np.array(big))
            rows.extend((loss, float(a), float(b)) for a, b in zip(g2, tr, strict=True))
    if not rows:
        return None, []
    losses = np.array([r[0] for r in rows])
    g2 = np.array([r[1] for r in rows])
    tr = np.array([r[2] for r in rows])
    start = float(losses.max())
    rng = np.random.default_rng(seed)

    def band(lo: float, hi: float) -> NoiseScaleAtLoss | None:
        mask = (losses >= lo) & (losses <= hi)
        if mask.sum() < 2:
            return None
        _, _, ratio = ratio_of_means_bootstrap(
            tr[mask],
            g2[mask],
            confidence=0.95,
            bootstrap=1000,
            rng=rng,
            formula=B_SIMPLE_FORMULA,
            names=("tr Σ", "|G|²"),
        )
        ci = None
        if ratio.ci is not None:
            ci = tuple(v if math.isfinite(v) else None for v in ratio.ci)
        return NoiseScaleAtLoss(
            eval_loss_low=lo,
            eval_loss_high=hi,
            value=ratio.value,
            ci=ci,  # type: ignore[arg-type]
            value_tokens=None if ratio.value is None or tokens is None else ratio.value * tokens,
            n_steps=int(mask.sum()),
            undefined_reason=ratio.undefined_reason,
            formula=B_SIMPLE_FORMULA,
        )

    at_target = band(target, target + TARGET_BAND * max(start - target, 0.0)) if target else None
    edges = np.quantile(losses, np.linspace(0, 1, 6))
    trend = [b for lo, hi in itertools.pairwise(edges) if (b := band(lo, hi))]
    return at_target, trend
