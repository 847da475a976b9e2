"""The branched critical batch size (Merrill et al. 2025) beside the brute-force B_crit.

The service's branch sweep (``sweep.type: branch``, docs/budget.md#branch-sweep) branches
from every intermediate checkpoint the benchmark uploads, at the truth's batch ladder, for a
window of ``WINDOW_STEPS_OF_LARGEST`` steps of the largest batch, with tolerance
``TOLERANCE`` nats per token compared at the end of the window, the lr by the service's
``sqrt`` rule (lr·√(B/B₀)). This module builds that request, reads the answer into
comparison rows (every checkpoint's CBS, the one nearest the target loss, against the truth's
B_crit) and the cost beside the batch sweep's. All of it pure: no training, no service.
"""

from __future__ import annotations

import math
from typing import Any

from predictive.compare import Row, _num, dig

#: ε of the CBS rule, nats per token (the service's default): B keeps up when its loss at the
#: end of the window is at most the smallest batch's + ε.
TOLERANCE = 0.01
#: The window: this many optimizer steps of the largest swept batch (so the smallest batch of
#: a 8…256 ladder takes 32× as many).
WINDOW_STEPS_OF_LARGEST = 20


def branch_sweep_settings(
    batch_sizes: list[int] | tuple[int, ...],
    tokens_per_example: int,
    checkpoint_steps: list[int],
) -> dict[str, Any]:
    """The ``sweep`` of a branch-sweep job: the batch ladder, a window in which the largest
    batch takes ``WINDOW_STEPS_OF_LARGEST`` steps, ε = ``TOLERANCE`` at the end of the window,
    each checkpoint's training step, and a step cap the smallest batch's window fits in."""
    ladder = sorted(batch_sizes)
    window = WINDOW_STEPS_OF_LARGEST * ladder[-1] * tokens_per_example
    smallest_steps = math.ceil(window / (ladder[0] * tokens_per_example))
    return {
        "type": "branch",
        "batch_sizes": ladder,
        "window_tokens": window,
        "tolerance": TOLERANCE,
        "compare": "end",
        "checkpoint_steps": list(checkpoint_steps),
        "max_steps": max(2000, 2 * smallest_steps),
    }


def _branch(answers: dict) -> dict | None:
    sweep = answers.get("branch_sweep") or {}
    if sweep.get("status") != "succeeded":
        return None
    return dig(sweep, "result.sweep.branch")


def nearest_to_target(checkpoints: list[dict], target: float) -> dict | None:
    """The checkpoint whose loss is nearest the target loss (the truth's B_crit is the batch
    for training to that loss)."""
    with_loss = [c for c in checkpoints if _num(c.get("loss")) is not None]
    if not with_loss:
        return None
    return min(with_loss, key=lambda c: abs(c["loss"] - target))


def _cbs_note(c: dict) -> str:
    status = c.get("status")
    nxt = c.get("next_batch")
    note = f"{status}" + (f", next {nxt}" if nxt is not None else "")
    if c.get("loss") is not None:
        note = f"loss {c['loss']:.4g}; " + note
    return note


#: The numbers a branch sweep gives per checkpoint: the ladder CBS (Merrill et al. 2025),
#: the token-efficiency fit and the ε-crossing in log B (docs/budget.md#branch-sweep).
ESTIMATES = (
    ("CBS", None),
    ("efficiency B_c", "efficiency"),
    ("ε-crossing", "crossing"),
)


def _estimate_note(c: dict, key: str) -> str:
    e = c.get(key) or {}
    ends = f"[{_fmt(e.get('low'))}, {_fmt(e.get('high'))}]"
    note = f"{e.get('status')}, bracket {ends}"
    if e.get("rms_residual") is not None:
        note += f", rms resid. {e['rms_residual']:.3f}"
    return note


def _fmt(x: Any) -> str:
    return "—" if x is None else f"{x:.3g}"


def _estimate_rows(c: dict, truth: dict, where: str) -> list[Row]:
    rows = [
        Row(
            f"branch sweep: CBS {where}",
            _num(c.get("critical_batch")),
            truth["b_crit"],
            note=_cbs_note(c),
            truth_note=truth["b_crit_note"],
        )
    ]
    for label, key in ESTIMATES[1:]:
        assert key is not None
        if c.get(key) is None:
            continue
        rows.append(
            Row(
                f"branch sweep: {label} {where}",
                _num(c[key].get("value")),
                truth["b_crit"],
                note=_estimate_note(c, key),
                truth_note=truth["b_crit_note"],
            )
        )
    return rows


def branch_rows(answers: dict, truth: dict, target: float) -> list[Row]:
    """Every checkpoint's CBS, efficiency fit and ε-crossing, and those of the checkpoint
    nearest ``target``, against the truth's B_crit (``truth`` as
    ``bench_predictive.summarise`` gives it); one ``not_available`` row with the reason when
    the sweep did not succeed or was not run."""
    branch = _branch(answers)
    if branch is None:
        sweep = answers.get("branch_sweep") or {}
        status = sweep.get("status", "not_run")
        reason = f"branch sweep {status}" + (f": {sweep['error']}" if sweep.get("error") else "")
        return [
            Row(
                "branched CBS (Merrill et al. 2025)",
                None,
                truth["b_crit"],
                note=reason,
                truth_note=truth["b_crit_note"],
            )
        ]
    checkpoints = branch.get("checkpoints") or []
    rows = [r for c in checkpoints for r in _estimate_rows(c, truth, f"at step {c.get('step')}")]
    near = nearest_to_target(checkpoints, target)
    if near is not None:
        where = f"nearest the target loss {target} (step {near.get('step')})"
        rows += _estimate_rows(near, truth, where)
    return rows


def window_rows(branch: dict, tokens_per_example: float) -> list[dict[str, Any]]:
    """Every checkpoint's three numbers on the windows its curves contain: the branches train
    at a constant lr after the same warm-up on the same examples, so the curves cut at an
    evaluation are what a shorter window would have given (the planner's functions on them)."""
    from curvplan_core.planner.branched_batch import (
        BranchLosses,
        critical_batch_from_branches,
        efficiency_fit,
        eps_crossing,
    )

    tolerance = float(branch.get("tolerance") or TOLERANCE)
    out = []
    for c in branch.get("checkpoints") or []:
        curves = [cv for cv in c.get("curves") or [] if cv.get("losses")]
        if len(curves) < 2:
            continue
        n_evals = min(len(cv["tokens"]) for cv in curves)
        for k in range(1, n_evals):
            cut = [
                BranchLosses(
                    cv["batch_size"],
                    [t / tokens_per_example for t in cv["tokens"][: k + 1]],
                    cv["losses"][: k + 1],
                )
                for cv in curves
            ]
            verdict = critical_batch_from_branches(cut, tolerance)
            row: dict[str, Any] = {
                "step": c.get("step"),
                "window_tokens": curves[0]["tokens"][k],
                "cbs": verdict.critical_batch,
                "cbs_status": verdict.status,
            }
            if verdict.critical_batch is not None:  # not_measured: no estimate at all
                fit = efficiency_fit(cut, tolerance).estimate
                row.update(
                    efficiency=fit.value,
                    efficiency_status=fit.status,
                    efficiency_low=fit.low,
                    efficiency_high=fit.high,
                    crossing=eps_crossing(verdict, tolerance).value,
                )
            out.append(row)
    return out


def training_tokens(sweep_answer: dict) -> float | None:
    """Tokens a batch sweep's runs trained on: Σ last step × B × tokens per example, every
    run (censored ones included)."""
    sweep = dig(sweep_answer, "result.sweep")
    if not sweep or sweep_answer.get("status") != "succeeded":
        return None
    per_example = _num(sweep.get("tokens_per_example")) or 1.0
    runs = [p["result"] for p in sweep.get("points") or [] if p.get("result")]
    return float(sum(r["eval_steps"][-1] * r["batch_size"] for r in runs) * per_example)


def truth_batch_tokens(seeds: dict, tokens_per_example: float) -> dict[str, float]:
    """Per seed: Σ_B S(B)·B tokens of the brute-force runs at their tuned lr (what one batch
    sweep that knew the best lr would train), censored batch sizes left out."""
    out = {}
    for seed, s in seeds.items():
        points = s["batch"]["points"]
        out[seed] = float(
            sum(p["steps"] * p["batch_size"] for p in points if p["steps"] is not None)
            * tokens_per_example
        )
    return out


def cost(answers: dict, seeds: dict, tokens_per_example: float) -> dict[str, Any]:
    """The branch sweep's tokens beside a batch sweep's (the service's in this run when it ran
    one, and the truth's tuned-lr runs), with the ratios batch / branch."""
    branch = _branch(answers) or {}
    tokens = _num(branch.get("tokens_processed"))
    sweep_tokens = training_tokens(answers.get("batch_sweep") or {})
    truth_tokens = truth_batch_tokens(seeds, tokens_per_example)

    def ratio(a: float | None) -> float | None:
        return a / tokens if a is not None and tokens else None

    return {
        "branch_tokens": tokens,
        "branch_examples": _num(branch.get("examples_processed")),
        "branch_window_tokens": _num(branch.get("window_tokens")),
        "batch_sweep_tokens": sweep_tokens,
        "batch_sweep_over_branch": ratio(sweep_tokens),
        "truth_batch_tokens": truth_tokens,
        "truth_batch_over_branch": {k: ratio(v) for k, v in truth_tokens.items()},
        "branch_wall_s": _num((answers.get("branch_sweep") or {}).get("wall_s_since_submit")),
        "batch_sweep_wall_s": _num((answers.get("batch_sweep") or {}).get("wall_s_since_submit")),
    }


def existing_files(workdir: Any, spec: dict) -> dict[str, Any] | None:
    """The files an earlier run of the same mode wrote to ``workdir`` (``write_files``'s
    names, the same spec), so ``--only branch`` uploads those instead of training the
    reference run again; None when any is missing or the spec differs."""
    import json
    from pathlib import Path

    root = Path(workdir)
    names = ("checkpoint", "train", "eval")
    paths = {n: root / f"{n}.safetensors" for n in names}
    spec_path = root / "spec.json"
    if not spec_path.exists() or json.loads(spec_path.read_text()) != spec:
        return None
    steps = sorted(int(p.stem.split("_", 1)[1]) for p in root.glob("step_*.safetensors"))
    if not steps or not all(p.exists() for p in paths.values()):
        return None
    return {
        **paths,
        "spec": spec_path,
        "intermediates": [root / f"step_{s}.safetensors" for s in steps],
    }


def checkpoint_steps(intermediates: list[Any]) -> list[int]:
    """The training step of each ``step_<n>.safetensors`` file, in order."""
    return [int(str(p).rsplit("step_", 1)[1].split(".", 1)[0]) for p in intermediates]


def markdown_lines(service: dict, seeds: dict, tokens_per_example: float) -> list[str]:
    """The branch sweep's section of the report: its settings, the CBS per checkpoint, the
    warm-up schedule, the ``budget.batch`` it led and its cost beside the batch sweep's."""
    branch = _branch(service)
    sweep = service.get("branch_sweep") or {}
    if branch is None:
        return ["", f"Branch sweep: {sweep.get('status', 'not_run')} {sweep.get('error') or ''}"]
    lines = [
        "",
        "## Branch sweep (Merrill et al. 2025)",
        "",
        f"Rule: {branch.get('rule')}. lr: {branch.get('lr_rule')}. Window "
        f"{branch.get('window_tokens'):,.0f} tokens ({branch.get('window_examples'):,} "
        f"examples) per branch, batches {branch.get('batch_sizes')}.",
        "",
        "| step | loss | CBS | status | next batch | excess over the smallest batch by B | "
        "efficiency B_c [±ε bracket] | e_B/E by B | ε-crossing |",
        "|---:|---:|---:|---|---:|---|---|---|---:|",
    ]
    for c in branch.get("checkpoints") or []:
        excess = ", ".join(
            f"{cv['batch_size']}: {cv['excess']:+.4f}"
            if cv.get("excess") is not None
            else f"{cv['batch_size']}: —"
            for cv in c.get("curves") or []
        )
        window = _num(branch.get("window_examples"))
        reach = ", ".join(
            f"{cv['batch_size']}: {cv['reference_examples'] / window:.3f}"
            + ("" if cv.get("reference_reach") == "inside" else f" ({cv.get('reference_reach')})")
            for cv in c.get("curves") or []
            if cv.get("reference_examples") is not None and window
        )
        eff = c.get("efficiency") or {}
        efficiency = (
            f"{eff['value']:.1f} {eff['status']} [{_fmt(eff.get('low'))}, {_fmt(eff.get('high'))}]"
            if eff
            else "—"
        )
        crossing = f"{c['crossing']['value']:.1f}" if c.get("crossing") else "—"
        loss = "—" if c.get("loss") is None else f"{c['loss']:.4f}"
        lines.append(
            f"| {c.get('step')} | {loss} | {c.get('critical_batch')} | {c.get('status')} | "
            f"{c.get('next_batch')} | {excess} | {efficiency} | {reach or '—'} | {crossing} |"
        )
    windows = window_rows(branch, tokens_per_example)
    if windows:
        lines += [
            "",
            "The same numbers on shorter windows (the curves cut at each evaluation: constant "
            "lr after the same warm-up on the same examples, so a cut curve is a shorter "
            "window's):",
            "",
            "| step | window tokens | CBS | efficiency B_c [±ε bracket] | ε-crossing |",
            "|---:|---:|---:|---|---:|",
        ]
        for w in windows:
            estimates = (
                "— | —"
                if w["cbs"] is None
                else f"{w['efficiency']:.1f} {w['efficiency_status']} "
                f"[{_fmt(w['efficiency_low'])}, {_fmt(w['efficiency_high'])}] | "
                f"{w['crossing']:.1f}"
            )
            lines.append(
                f"| {w['step']} | {w['window_tokens']:,.0f} | {w['cbs']} ({w['cbs_status']}) | "
                f"{estimates} |"
            )
    schedule = branch.get("warmup_schedule") or []
    lines += [
        "",
        "Warm-up schedule (from step: batch): "
        + (", ".join(f"{s.get('from_step')}: {s.get('batch_size')}" for s in schedule) or "—"),
    ]
    analysis = dig(service, "analyze_with_sweeps.result.recommendation.budget.batch")
    if analysis:
        keys = (
            "source",
            "critical_method",
            "recommended",
            "critical",
            "critical_bracket",
            "expected_steps",
        )
        lines += [
            "",
            "budget.batch of the analysis given the branch sweep: "
            + "; ".join(f"{k} {analysis.get(k)}" for k in keys),
        ]
    c = cost(service, seeds, tokens_per_example)
    truth_tokens = ", ".join(
        f"seed {k} {v:,.0f} ({c['truth_batch_over_branch'][k]:.3g}×)"
        for k, v in c["truth_batch_tokens"].items()
    )
    sweep_tokens = c["batch_sweep_tokens"]
    lines += [
        "",
        f"Cost: the branch sweep trained {c['branch_tokens'] or 0:,.0f} tokens "
        f"(wall {c['branch_wall_s'] or 0:.0f} s since submit). A batch sweep: "
        + (
            f"the service's in this run {sweep_tokens:,.0f} tokens "
            f"({c['batch_sweep_over_branch']:.3g}× the branch sweep's), "
            if sweep_tokens
            else "not run in this run; "
        )
        + f"the truth's runs at their tuned lr to the target Σ S(B)·B: {truth_tokens} "
        "(batch / branch).",
    ]
    return lines
