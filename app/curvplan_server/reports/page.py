"""The report page: one self-contained HTML document per job (no JavaScript, no external
resources), with the budget at the top, the job summary, the recommendation as tables and
the figures as inline SVG (drawn by ``curvplan_server.reports.plots``).

Every value that comes from a user or a job (names, tags, errors, block names) is
HTML-escaped.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from curvplan.types.jobs import attempt_text
from curvplan_server.reports.plots import (
    Plot,
    build_plots,
    fmt,
    inline_svg,
    recommendation_of,
)


def esc(value: Any) -> str:
    """HTML-escaped text of any value (quotes too: safe in attributes)."""
    return html.escape(str(value), quote=True)


fmt_number = fmt

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#222;background:#fff}
header{background:#243b53;color:#fff;padding:14px 28px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;font-size:13px;opacity:.85}
main{padding:8px 28px 40px;max-width:1100px}
h2{font-size:17px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:30px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7} td.num{text-align:right;font-variant-numeric:tabular-nums}
.status-succeeded{color:#1a7f37}.status-failed,.status-cancelled{color:#b42318}
.empty{background:#fff8e6;border:1px solid #f0d58c;padding:10px 14px;font-size:13px}
.note{color:#555;font-size:12px}.plot-wrap{overflow-x:auto}
.plot-wrap svg{max-width:100%;height:auto}
.budget{background:#f0f6ff;border:1px solid #b6d0f0;padding:8px 16px;margin-top:16px}
.budget h2{border:none;margin:6px 0}
figure{margin:10px 0 22px} figcaption{font-size:12px;color:#555;max-width:720px}
code{font-size:12px} pre{font-size:12px;background:#f6f8fa;padding:8px;overflow-x:auto}
summary{cursor:pointer;font-size:13px}
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: set[int]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            cls = ' class="num"' if i in numeric else ""
            cells.append(f"<td{cls}>{esc(_text(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return fmt_number(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list | tuple) and len(value) == 2:
        return f"[{_text(value[0])}, {_text(value[1])}]"
    return str(value)


def _not_computed(section: Any) -> str | None:
    if isinstance(section, dict) and section.get("status") == "not_computed":
        return str(section.get("reason", ""))
    return None


def _empty(reason: str) -> str:
    return f'<p class="empty">{esc(reason)}</p>'


def _attempts(job: dict[str, Any]) -> str:
    children = job.get("children")
    statuses = [str(c.get("status")) for c in children] if isinstance(children, list) else None
    try:
        return attempt_text(
            int(job.get("attempt") or 0),
            int(job.get("max_attempts") or 0),
            str(job.get("status")),
            statuses,
        )
    except (TypeError, ValueError):
        return f"{job.get('attempt')}/{job.get('max_attempts')}"


def summary_html(job: dict[str, Any]) -> str:
    tags = ", ".join(f"{k}={v}" for k, v in sorted((job.get("tags") or {}).items())) or "–"
    rows = [
        ("job", job.get("id")),
        ("kind", job.get("kind")),
        ("status", job.get("status")),
        ("name", job.get("name")),
        ("tags", tags),
        ("attempt", _attempts(job)),
        ("created", job.get("created_at")),
        ("started", job.get("started_at")),
        ("finished", job.get("finished_at")),
    ]
    model = model_text(job)
    if model is not None:
        rows.insert(2, ("model", model))
    error = job.get("error")
    if isinstance(error, dict):
        rows.append(
            (
                "error",
                f"{error.get('type')}: {error.get('title') or ''} "
                f"{error.get('detail') or ''}".strip(),
            )
        )
    body = "".join(
        f'<tr><th>{esc(k)}</th><td class="{"status-" + esc(v) if k == "status" else ""}">'
        f"{esc(_text(v))}</td></tr>"
        for k, v in rows
    )
    return f'<table class="summary">{body}</table>'


def model_text(job: dict[str, Any]) -> str | None:
    """What an analyze job measured (see :func:`curvplan.types.model_source.describe_model`)."""
    from curvplan.types.model_source import describe_model

    measured = (job.get("result") or {}).get("measurements")
    return describe_model(job.get("request"), measured)


def _interval(ci: Any) -> str:
    if not ci:
        return ""
    return f"[{_text(ci[0])}, {_text(ci[1])}]"


def budget_html(rec: dict[str, Any] | None) -> str:
    """The budget, first on the page: data, batch, sharpness threshold, with units."""
    budget = (rec or {}).get("budget")
    if not isinstance(budget, dict):
        return _empty("No budget: the job has no recommendation (yet).")
    data, batch, lr = budget["data"], budget["batch"], budget["learning_rate"]
    rows: list[tuple[Any, ...]] = [
        (
            "training data",
            data.get("recommended_examples"),
            _interval(data.get("recommended_examples_ci")),
            "examples",
            data.get("source"),
        )
    ]
    step = data.get("next_step")
    if isinstance(step, dict):
        rows.append(
            (
                "to get a training-data number",
                step.get("training_runs"),
                "",
                "training runs",
                step.get("command"),
            )
        )
    evaluation = data.get("evaluation_set_size")
    if isinstance(evaluation, dict):
        rows.append(
            (
                "evaluation-set size (loss to ±ε)",
                evaluation.get("examples"),
                _interval(evaluation.get("ci")),
                "examples",
                f"ε = {_text(evaluation.get('tolerance'))} nats, "
                f"{evaluation.get('variance_method')} variance"
                + (" — the sample looks correlated" if evaluation.get("correlated") else ""),
            )
        )
    stab = data.get("landscape_stabilisation")
    if isinstance(stab, dict):
        rows.append(
            (
                "landscape stabilisation k*(ε)",
                stab.get("examples"),
                _interval(stab.get("ci")),
                "examples",
                f"ε = {_text(stab.get('tolerance'))} nats",
            )
        )
    if data.get("available_samples") is not None:
        enough = {True: "enough", False: "NOT enough", None: "–"}[data.get("available_is_enough")]
        rows.append(("you have", data.get("available_samples"), "", "examples", enough))
    rows.append(("batch size", batch.get("recommended"), "", "examples", batch.get("source")))
    if batch.get("recommended_tokens") is not None:
        rows.append(("batch size", batch.get("recommended_tokens"), "", "tokens", ""))
    rows.append(
        (
            "critical batch B_crit",
            batch.get("critical"),
            _interval(batch.get("critical_ci")),
            "examples",
            "",
        )
    )
    if batch.get("source") == "branch_sweep":
        low, high = batch.get("critical_bracket") or (None, None)
        rows.append(
            (
                "critical batch: swept bracket",
                "",
                f"[{_text(low)}, {_text(high)})",
                "examples",
                batch.get("critical_formula"),
            )
        )
        for e in batch.get("branch_estimates") or []:
            lead = " (leads)" if e.get("method") == batch.get("critical_method") else ""
            rows.append(
                (
                    f"branch estimate: {e.get('method')}{lead}",
                    _estimate_text(e),
                    f"[{_text(e.get('low'))}, {_text(e.get('high'))}]",
                    "examples",
                    e.get("formula"),
                )
            )
        for stage in batch.get("warmup_schedule") or []:
            rows.append(
                (
                    f"warm-up: from step {_text(stage.get('from_step'))}",
                    stage.get("batch_size"),
                    "",
                    "examples",
                    f"CBS {stage.get('status')} at that checkpoint",
                )
            )
    law = batch.get("scaling_law")
    if law:
        low, high = law.get("measured_tokens_range") or (None, None)
        for name, value, interval in (
            ("batch law B_crit = c·D^γ: γ", law.get("gamma"), law.get("gamma_ci")),
            ("batch law B_crit = c·D^γ: c", law.get("c"), law.get("c_ci")),
        ):
            rows.append(
                (
                    name,
                    value,
                    _interval(interval),
                    "",
                    f"pilot sweeps {_text(low)}–{_text(high)} tokens, target "
                    f"{_text(law.get('target_tokens'))} tokens",
                )
            )
    if batch.get("expected_steps") is not None:
        rows.append(
            (
                "expected steps",
                batch.get("expected_steps"),
                _interval(batch.get("expected_steps_ci")),
                "steps",
                "at the recommended batch",
            )
        )
    rows.append(
        (
            "GD sharpness threshold 2/λ_max (full model)",
            lr.get("gd_sharpness_threshold"),
            "",
            "step size",
            "full-batch GD: above it the loss stops decreasing monotonically (edge of "
            "stability); not a divergence limit, not for SGD or Adam",
        )
    )
    if lr.get("block_threshold") is not None:
        rows.append(
            (
                "2/λ_max of the largest block",
                lr.get("block_threshold"),
                "",
                "step size",
                f"upper bound on the threshold ({_text(lr.get('lambda_max_block_name'))})",
            )
        )
    table = _table(("", "value", "interval", "unit", "source"), rows, {1})
    notes = [
        data.get("guarantee") if data.get("source") != "not_available" else data.get("reason"),
        batch.get("basis") if batch.get("source") != "not_available" else batch.get("reason"),
        lr.get("meaning"),
        *budget.get("warnings", []),
    ]
    items = "".join(f"<li>{esc(_text(n))}</li>" for n in notes if n)
    return f'<section id="budget">{table}<ul class="budget-notes">{items}</ul></section>'


def _estimate_text(e: Any) -> str:
    """A continuous branch estimate: its value, or its bound (≥ / ≤) when only that is known."""
    if not isinstance(e, dict):
        return "—"
    mark = {"at_least": "≥ ", "at_most": "≤ "}.get(str(e.get("status")), "")
    return f"{mark}{_text(e.get('value'))}"


def branch_html(job: dict[str, Any]) -> str:
    """A branch sweep's table: per checkpoint the CBS, its bracket and each batch's excess
    loss over the smallest batch's; then the rule, the window and the warm-up schedule."""
    result = job.get("result") if isinstance(job.get("result"), dict) else {}
    branch = ((result or {}).get("sweep") or {}).get("branch")
    if not isinstance(branch, dict):
        return ""
    sizes = branch.get("batch_sizes") or []
    rows = []
    for c in branch.get("checkpoints") or []:
        excess = {k.get("batch_size"): k for k in c.get("curves") or []}
        cells = [
            "failed"
            if b not in excess
            else f"{_text(excess[b].get('excess'))}"
            + {True: " ✓", False: " ✗"}.get(excess[b].get("within_tolerance"), "")
            for b in sizes
        ]
        rows.append(
            (
                c.get("step"),
                c.get("loss"),
                c.get("critical_batch"),
                c.get("status"),
                c.get("next_batch"),
                _estimate_text(c.get("efficiency")),
                _estimate_text(c.get("crossing")),
                *cells,
                "; ".join(c.get("notes") or []),
            )
        )
    headers = (
        "step",
        "loss",
        "CBS",
        "status",
        "next batch",
        "efficiency B_c",
        "ε-crossing",
        *[f"excess B={b}" for b in sizes],
    )
    table = _table((*headers, "notes"), rows, {0, 1, 2, 4})
    stages = [
        (s.get("from_step"), s.get("batch_size"), s.get("status"))
        for s in branch.get("warmup_schedule") or []
    ]
    schedule = _table(("from step", "batch size", "CBS status"), stages, {0, 1})
    notes = [
        branch.get("rule"),
        f"window: {_text(branch.get('window_tokens'))} tokens "
        f"({branch.get('window_examples')} examples) per branch",
        f"learning rate: {branch.get('lr_rule')}",
        f"cost: {branch.get('examples_processed')} examples processed in all",
        branch.get("schedule_note"),
    ]
    items = "".join(f"<li>{esc(_text(n))}</li>" for n in notes if n)
    return (
        '<section id="branch-sweep"><h2>Branch sweep: critical batch size by checkpoint</h2>'
        f"{table}<h3>Batch-size warm-up schedule</h3>{schedule}<ul>{items}</ul></section>"
    )


def children_html(job: dict[str, Any]) -> str:
    children = job.get("children") or []
    if not children:
        return ""
    rows = [
        (c.get("name"), c.get("status"), c.get("attempt"), c.get("error_type"), c.get("id"))
        for c in children
    ]
    return "<h2>Child jobs</h2>" + _table(("name", "status", "attempt", "error", "id"), rows, set())


def recommendation_html(rec: dict[str, Any] | None, job: dict[str, Any]) -> str:
    if rec is None:
        return _empty(f"No recommendation: the job is {job.get('status')}.")
    parts = [
        _sample_size_html(rec.get("sample_size")),
        _batch_html(rec.get("batch_size")),
        _scaling_html(rec.get("scaling")),
        _curvature_html(rec.get("curvature")),
    ]
    warnings = rec.get("warnings") or []
    if warnings:
        rows = [(w.get("code"), w.get("section"), w.get("detail")) for w in warnings]
        parts.append("<h3>Warnings</h3>" + _table(("code", "section", "detail"), rows, set()))
    return "".join(parts)


def _k(value: Any) -> str:
    why = _not_computed(value)
    if why is not None or not isinstance(value, dict):
        return "n/a"
    text = _text(value.get("k"))
    if value.get("ci"):
        text += " " + _text(value["ci"])
    return text


def _sample_size_html(section: Any) -> str:
    out = "<h3>Sample size (Δ_k curve; Petrov et al. 2025 Theorem 7)</h3>"
    why = _not_computed(section)
    if why is not None or not isinstance(section, dict):
        return out + _empty(f"Not computed: {why}")
    fit = section.get("fit") or {}
    if _not_computed(fit) is None and "C" in fit:
        out += _table(
            ("C", "C interval", "α", "α interval", "r²", "fit window k", "theory α"),
            [
                (
                    fit.get("C"),
                    fit.get("C_ci"),
                    fit.get("alpha"),
                    fit.get("alpha_ci"),
                    fit.get("r2"),
                    fit.get("window"),
                    fit.get("theory_alpha"),
                )
            ],
            {0, 2, 4, 6},
        )
    else:
        out += _empty(f"Fit not computed: {_not_computed(fit)}")
    rows = [
        (
            t.get("tolerance"),
            _k(t.get("empirical")),
            _k(t.get("theoretical")),
            _k(t.get("theoretical_tight")),
            _k(t.get("squared")),
            _k(t.get("evaluation_set_size")),
        )
        for t in section.get("per_tolerance") or []
    ]
    if rows:
        out += _table(
            (
                "tolerance ε",
                "k* empirical",
                "k* Theorem 7",
                "k* Thm 7 (tight)",
                "k* squared",
                "evaluation-set size",
            ),
            rows,
            {0, 1, 2, 3, 4},
        )
    for m in section.get("missing") or []:
        out += f'<p class="note">Missing {esc(m.get("item"))}: {esc(m.get("reason"))}</p>'
    return out


def _batch_html(section: Any) -> str:
    out = "<h3>Batch size (McCandlish et al. 2018)</h3>"
    why = _not_computed(section)
    if why is not None or not isinstance(section, dict):
        return out + _empty(f"Not computed: {why}")
    rows = []
    for key, label in (("b_simple", "B_simple"), ("b_noise", "B_noise")):
        est = section.get(key)
        reason = _not_computed(est)
        rows.append(
            (label, "n/a" if reason else (est or {}).get("value"), reason or (est or {}).get("ci"))
        )
    crit = section.get("b_crit")
    reason = _not_computed(crit)
    if reason:
        rows.append(("B_crit", "n/a", reason))
    elif isinstance(crit, dict):
        rows += [
            ("B_crit", crit.get("value"), crit.get("ci")),
            ("S_min (steps)", crit.get("s_min"), crit.get("s_min_ci")),
            ("E_min (examples)", crit.get("e_min"), crit.get("e_min_ci")),
        ]
    return out + _table(("quantity", "value", "interval / note"), rows, {1})


def _scaling_html(section: Any) -> str:
    out = "<h3>Data scaling L(D) = E + A·D^(−β)</h3>"
    why = _not_computed(section)
    if why is not None or not isinstance(section, dict):
        return out + _empty(f"Not computed: {why}")
    rows = [
        ("E", section.get("E"), section.get("E_ci")),
        ("A", section.get("A"), section.get("A_ci")),
        ("β", section.get("beta"), section.get("beta_ci")),
    ]
    return out + _table(("parameter", "value", "interval"), rows, {1})


def _curvature_html(section: Any) -> str:
    out = "<h3>Curvature per block</h3>"
    why = _not_computed(section)
    if why is not None or not isinstance(section, dict):
        return out + _empty(f"Not computed: {why}")
    rows = [
        (
            b.get("name"),
            b.get("spectral_norm"),
            b.get("lambda_max"),
            b.get("lambda_min"),
            f"{100 * float(b.get('share_of_total_norm') or 0):.1f}%",
            b.get("block_threshold"),
        )
        for b in section.get("blocks") or []
    ]
    if not rows:
        return out + _empty("No per-block measurements were given.")
    out += _table(
        ("block", "‖H_b‖₂", "λ_max", "λ_min", "share", "2/λ_max (block)"), rows, {1, 2, 3, 4, 5}
    )
    if section.get("heterogeneity_ratio") is not None:
        out += (
            f'<p class="note">Heterogeneity ratio (max/min block norm): '
            f"{esc(_text(section['heterogeneity_ratio']))}</p>"
        )
    return out


def abbreviate(value: Any, max_items: int = 8) -> Any:
    """``value`` with long lists cut to their first items plus a count (for display only)."""
    if isinstance(value, dict):
        return {k: abbreviate(v, max_items) for k, v in value.items()}
    if isinstance(value, list):
        head = [abbreviate(v, max_items) for v in value[:max_items]]
        if len(value) > max_items:
            head.append(f"… {len(value) - max_items} more")
        return head
    return value


def inputs_html(job: dict[str, Any]) -> str:
    """The job's request (model spec, artifacts, options, targets), long arrays shortened."""
    request = job.get("request")
    if not isinstance(request, dict):
        return _empty("The request is not available.")
    text = json.dumps(abbreviate(request), indent=2, ensure_ascii=False)
    return (
        "<details><summary>Request body (long arrays shortened)</summary>"
        f"<pre>{esc(text)}</pre></details>"
    )


def plot_html(plot: Plot) -> str:
    head = f'<section class="plot-section" id="section-{esc(plot.id)}"><h3>{esc(plot.title)}</h3>'
    svg = inline_svg(plot)
    if svg is None:
        return head + _empty(f"Empty: {plot.empty_reason}") + "</section>"
    caption = f"<figcaption>{esc(plot.caption)}</figcaption>" if plot.caption else ""
    return f'{head}<figure><div class="plot-wrap">{svg}</div>{caption}</figure></section>'


def render_report(job: dict[str, Any], plots: list[Plot] | None = None) -> str:
    """The whole HTML document of a job's report (``plots``: the kept figures, else drawn)."""
    plots = build_plots(job) if plots is None else plots
    name = job.get("name") or "unnamed job"
    title = f"curvplan report — {name}"
    sections = "".join(plot_html(p) for p in plots)
    return (
        "<!DOCTYPE html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><p>{esc(job.get('kind'))} job {esc(job.get('id'))} · "
        f"{esc(job.get('status'))}</p></header><main>"
        f"<h2>Budget</h2>{budget_html(recommendation_of(job))}"
        f"<h2>Summary</h2>{summary_html(job)}"
        f"{branch_html(job)}"
        f"{children_html(job)}"
        f"<h2>Inputs</h2>{inputs_html(job)}"
        f"<h2>Recommendation</h2>{recommendation_html(recommendation_of(job), job)}"
        f"<h2>Plots</h2>{sections}"
        '<p class="note">Rendered by the curvplan service; figures drawn with matplotlib, '
        "also served as SVG and PNG under /v1/jobs/{id}/plots.</p>"
        "</main></body></html>"
    )
