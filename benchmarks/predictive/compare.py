"""Side by side: each budget number the service gave against the brute-force truth.

A row is (field, service, truth, ratio = service/truth, within 1.5×?). A field the service
does not answer (absent from its JSON, null, or ``source: not_available``) prints
``not_available`` with the service's reason when it gave one; it counts as not answered,
never as a pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GOAL = 1.5


def dig(obj: Any, path: str) -> Any:
    """``obj["a"]["b"]…`` for ``path`` "a.b…"; None where any step is missing."""
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


@dataclass
class Row:
    field: str
    service: float | None
    truth: float | None
    note: str = ""
    truth_note: str = ""
    spread: float | None = None  # the truth's seeds' spread (largest / smallest seed)

    @property
    def ratio(self) -> float | None:
        if self.service is None or self.truth is None or self.truth == 0:
            return None
        return self.service / self.truth

    @property
    def verdict(self) -> str:
        if self.service is None:
            return "not_available"
        if self.ratio is None:
            return "no truth"
        ok = 1 / GOAL <= self.ratio <= GOAL
        return "yes" if ok else "MISSES"

    def as_dict(self) -> dict:
        return {
            "field": self.field,
            "service": self.service,
            "truth": self.truth,
            "ratio": self.ratio,
            "within_1_5x": self.verdict,
            "note": self.note,
            "truth_note": self.truth_note,
            "seeds_spread": self.spread,
        }


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _budget(answer: dict) -> dict | None:
    if answer.get("status") != "succeeded":
        return None
    return dig(answer, "result.recommendation.budget")


def budget_rows(label: str, answer: dict, truth: dict) -> list[Row]:
    """The budget of one analyze answer against the truth summary."""
    budget = _budget(answer)
    if budget is None:
        reason = f"the {label} job {answer.get('status')}: {answer.get('error')}"
        return [Row(f"{label}: budget", None, None, note=reason)]
    rows = []
    data = budget.get("data") or {}
    source = data.get("source")
    value = _num(data.get("recommended_examples")) if source != "not_available" else None
    rows.append(
        Row(
            f"{label}: budget.data.recommended_examples",
            value,
            truth["data_needed"],
            note=f"source {source}" + (f"; {data.get('reason')}" if value is None else ""),
            truth_note=truth["data_needed_note"],
        )
    )
    batch = budget.get("batch") or {}
    bsource = batch.get("source")
    available = bsource != "not_available"
    rows.append(
        Row(
            f"{label}: budget.batch.critical",
            _num(batch.get("critical")) if available else None,
            truth["b_crit"],
            note=f"source {bsource}" + ("" if available else f"; {batch.get('reason')}"),
            truth_note=truth["b_crit_note"],
        )
    )
    rows.append(
        Row(
            f"{label}: budget.batch.recommended",
            _num(batch.get("recommended")) if available else None,
            truth["b_crit_pow2"],
            note=f"source {bsource}",
            truth_note="power of two nearest the brute-force B_crit",
        )
    )
    rec = _num(batch.get("recommended"))
    steps_truth = truth["steps_at"](rec) if rec else None
    rows.append(
        Row(
            f"{label}: budget.batch.expected_steps",
            _num(batch.get("expected_steps")),
            steps_truth,
            note=str(batch.get("reason") or "") if batch.get("expected_steps") is None else "",
            truth_note="brute-force S(B) at the service's recommended batch",
        )
    )
    old = dig(answer, "result.recommendation.batch_size.recommended")
    if old is not None:
        rows.append(
            Row(
                f"{label}: batch_size.recommended (second batch answer)",
                _num(old),
                truth["b_crit_pow2"],
                truth_note="power of two nearest the brute-force B_crit",
            )
        )
    lr = budget.get("learning_rate") or {}
    # gd_stability_limit and lambda_max: answers stored before they were removed
    for name in ("gd_stability_limit", "block_threshold", "gd_sharpness_threshold"):
        if name in lr:
            rows.append(
                Row(
                    f"{label}: budget.learning_rate.{name}",
                    _num(lr.get(name)),
                    truth["gd_threshold"],
                    note=str(lr.get("lambda_max_source") or lr.get("lambda_max_block_name") or "")
                    if name != "gd_sharpness_threshold"
                    else str(lr.get("reason") or ""),
                    truth_note="2/λ_max of the full Hessian (Lanczos, all parameters)",
                )
            )
    for name in ("lambda_max", "lambda_max_block", "lambda_max_full", "full_lambda_max"):
        if name in lr:
            rows.append(
                Row(
                    f"{label}: budget.learning_rate.{name}",
                    _num(lr.get(name)),
                    truth["lambda_max"],
                    truth_note="full-Hessian λ_max on the same sample",
                )
            )
    return rows


def further_target_rows(answers: dict[str, dict], truth: dict) -> list[Row]:
    """budget.data of the analysis at each further target (after its own next rounds) against
    the truth's data for that target, the seeds' spread in the truth's note."""
    rows = []
    for more in (truth.get("data_by_target") or [])[1:]:
        target = more["target_loss"]
        answer = answers.get(f"{target:g}")
        if answer is None:
            continue
        budget = _budget(answer) or {}
        data = budget.get("data") or {}
        source = data.get("source")
        value = _num(data.get("recommended_examples")) if source != "not_available" else None
        rows.append(
            Row(
                f"analyze at {target:g} (+ sweeps): budget.data.recommended_examples",
                value,
                more["examples"],
                note=f"source {source}"
                + ("" if budget else f"; the job {answer.get('status')}: {answer.get('error')}")
                + (f"; {data.get('reason')}" if value is None and data.get("reason") else ""),
                truth_note="per seed "
                + ", ".join(
                    f"{v:,.0f}" if v is not None else str(b)
                    for v, b in zip(more["per_seed"], more["bounds"], strict=True)
                )
                + more["spread_text"],
            )
        )
    return rows


def data_round_lines(service: dict) -> list[str]:
    """The data sweeps run as the analyses printed them, and what budget.data said after
    each: the Markdown lines (none when the service half ran no data sweep)."""
    first = service.get("data_sweep") or {}
    if "command" not in first:
        return []
    lines = ["", "Data sweeps, each command run as the analysis printed it:", ""]
    for k, sweep in enumerate([first, *(service.get("data_next_rounds") or [])]):
        wall = sweep.get("wall_s")
        lines.append(
            f"{k + 1}. `{sweep['command']}` — {sweep.get('status')}"
            + ("" if wall is None else f", {wall / 60:.1f} min wall")
            + (f" ({sweep.get('error')})" if sweep.get("status") != "succeeded" else "")
        )
    lines += [
        "",
        "budget.data after each analysis with the sweeps:",
        "",
        "| target | data sweeps | source | recommended | interval | measured sizes | next round |",
        "|---:|---:|---|---:|---|---|---|",
    ]
    for r in service.get("data_rounds") or []:
        rec = r.get("recommended_examples")
        ci = r.get("recommended_examples_ci")
        sizes = r.get("measured_sizes")
        interval = (
            "—" if ci is None else " – ".join("open" if c is None else f"{c:,.0f}" for c in ci)
        )
        lines.append(
            f"| {r['target_loss']:g} | {len(r['data_sweeps'])} | {r.get('source')} | "
            f"{'—' if rec is None else format(rec, ',')} | "
            f"{interval} | "
            f"{'—' if not sizes else ' – '.join(f'{x:,.0f}' for x in sizes)} | "
            f"{', '.join(map(str, r.get('next_round_sizes') or [])) or '—'} |"
        )
    return lines


def sweep_rows(answers: dict, truth: dict) -> list[Row]:
    """The sweeps' own fits against the truth."""
    rows = []
    batch = answers.get("batch_sweep") or {}
    fit = dig(batch, "result.sweep.batch.fit") or {}
    note = "" if batch.get("status") == "succeeded" else f"sweep {batch.get('status')}"
    if fit.get("status") == "not_computed":
        note = fit.get("reason", "")
    rows.append(
        Row(
            "batch sweep: B_crit",
            _num(fit.get("value")),
            truth["b_crit"],
            note=note,
            truth_note=truth["b_crit_note"],
        )
    )
    rows.append(
        Row(
            "batch sweep: S_min",
            _num(fit.get("s_min")),
            truth["s_min"],
            note=note,
            truth_note="brute-force S_min",
        )
    )
    b_simple = dig(batch, "result.sweep.b_simple_at_target") or {}
    rows.append(
        Row(
            "batch sweep: B_simple at the target (two-batch)",
            _num(b_simple.get("value")),
            truth["b_crit"],
            note=str(b_simple.get("undefined_reason") or ""),
            truth_note="compared with the brute-force B_crit",
        )
    )
    data = answers.get("data_sweep") or {}
    dfit = dig(data, "result.sweep.data.fit") or {}
    dnote = "" if data.get("status") == "succeeded" else f"sweep {data.get('status')}"
    answer = dig(data, "result.recommendation.budget.data") or {}
    n = answer.get("recommended_examples")
    if answer.get("target_status") == "unreachable":
        dnote = f"unreachable (fitted E = {dfit.get('E')})"
    elif answer.get("source") == "extrapolated":
        dnote = dnote or "extrapolated beyond the measured sizes"
    rows.append(
        Row(
            "data sweep: budget.data",
            _num(n),
            truth["data_needed"],
            note=dnote,
            truth_note=truth["data_needed_note"],
        )
    )
    for more in (truth.get("data_by_target") or [])[1:]:  # the same L(D) at the other targets
        target = more["target_loss"]
        solved = solve_l_of_d(dfit, target)
        rows.append(
            Row(
                f"data sweep: L(D) solved at {target}",
                solved,
                more["examples"],
                note=dnote or ("" if solved is not None else "target at or below the fitted E"),
                truth_note="per seed "
                + ", ".join(
                    f"{v:,.0f}" if v is not None else str(b)
                    for v, b in zip(more["per_seed"], more["bounds"], strict=True)
                )
                + more["spread_text"],
            )
        )
    return rows  # the branch sweep's rows: predictive.branch.branch_rows


def solve_l_of_d(fit: dict, target: float) -> float | None:
    """D with E + A·D^(−β) = target from a data sweep's fitted L(D) (Kaplan et al. 2020,
    eq. 1.4 form): (A/(target − E))^(1/β); None when the target is at or below E."""
    e, a, beta = (_num(fit.get(k)) for k in ("E", "A", "beta"))
    if e is None or a is None or beta is None or beta <= 0 or a <= 0 or target <= e:
        return None
    return (a / (target - e)) ** (1 / beta)


def render(rows: list[Row]) -> str:
    """A Markdown table: field, service, truth, ratio, within 1.5×?"""

    def fmt(x: float | None) -> str:
        if x is None:
            return "—"
        if x == 0:
            return "0"
        return f"{x:.4g}" if abs(x) < 1e5 else f"{x:,.0f}"

    lines = [
        "| field | service | truth | ratio | truth's seeds' spread | within 1.5×? | note |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        service = "not_available" if r.service is None else fmt(r.service)
        ratio = "—" if r.ratio is None else f"{r.ratio:.3g}"
        truth = fmt(r.truth) if r.truth is not None or not r.truth_note else r.truth_note
        spread = "—" if r.spread is None else f"×{r.spread:.2f}"
        lines.append(
            f"| {r.field} | {service} | {truth} | {ratio} | {spread} | {r.verdict} | "
            f"{r.note.replace('|', '/')[:160]} |"
        )
    return "\n".join(lines)


def trend_table(answer: dict) -> list[dict]:
    """B_simple = tr Σ/|G|² and B_noise = tr(HΣ)/GᵀHG (McCandlish et al. 2018, eqs. 2.8 and
    2.7) at each intermediate checkpoint, from the analysis's measurements, with its loss."""
    points = (
        dig(answer, "result.intermediate_gradient_noise")
        or dig(answer, "result.planner_inputs.fields.gradient_noise_trend")
        or []
    )
    rows = []
    for p in points:

        def ratio(num: str, den: str, p: dict = p) -> float | None:
            a, b = _num(p.get(num)), _num(p.get(den))
            return a / b if a is not None and b is not None and a > 0 and b > 0 else None

        rows.append(
            {
                "checkpoint": p.get("checkpoint"),
                "step": p.get("step"),
                "loss": p.get("loss"),
                "b_simple": ratio("trace_sigma", "grad_sq_norm"),
                "b_noise": ratio("trace_h_sigma", "gHg"),
                "n_samples": p.get("n_samples"),
            }
        )
    return rows


def trend_rows(answer: dict, truth: dict, target: float) -> list[Row]:
    """Both noise scales at the target loss, log B linear in the loss through the
    checkpoints' point values (the harness's own interpolation, unweighted): which of the two
    would predict B_crit (issue item 4 asks the benchmark to decide)."""
    table = trend_table(answer)
    rows = []
    for name in ("b_simple", "b_noise"):
        pts = [(r["loss"], r[name]) for r in table if r["loss"] is not None and r[name]]
        value = None
        note = f"{len(pts)} checkpoints with a positive value"
        if len(pts) >= 2 and len({p[0] for p in pts}) >= 2:
            x = [p[0] for p in pts]
            y = [math.log(p[1]) for p in pts]
            n = len(x)
            mx, my = sum(x) / n, sum(y) / n
            sxx = sum((a - mx) ** 2 for a in x)
            slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
            value = math.exp(my + slope * (target - mx))
            if not min(x) <= target <= max(x):
                note += "; extrapolated"
        rows.append(
            Row(
                f"noise trend {name.replace('b_', 'B_')} at the target (harness fit)",
                value,
                truth["b_crit"],
                note=note,
                truth_note=truth["b_crit_note"],
            )
        )
    return rows
