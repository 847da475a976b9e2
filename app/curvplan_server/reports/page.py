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

from pydantic import JsonValue

from curvplan.budget_summary import budget_summary, estimate_text
from curvplan.types.jobs import attempt_text
from curvplan.types.planner import (
    BatchSizeSection,
    BCrit,
    CurvatureSection,
    Estimate,
    NotComputed,
    PowerLawFit,
    Recommendation,
    SampleSizeSection,
    SampleSizeValue,
    ScalingSection,
)
from curvplan_server.reports.plots import Plot, build_plots, fmt, inline_svg
from curvplan_server.reports.view import JobJson, ReportJob


def esc(value: object) -> str:
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
summary{cursor:pointer;font-size:13px} td.sub{padding-left:22px}
"""


Cell = object


def _table(headers: Sequence[str], rows: Sequence[Sequence[Cell]], numeric: set[int]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            cls = ' class="num"' if i in numeric else ""
            cells.append(f"<td{cls}>{esc(_text(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _text(value: Cell) -> str:
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


def _empty(reason: str) -> str:
    return f'<p class="empty">{esc(reason)}</p>'


def _attempts(job: ReportJob) -> str:
    if job.attempt is None or job.max_attempts is None:
        return f"{_text(job.attempt)}/{_text(job.max_attempts)}"
    statuses = [str(c.status) for c in job.children] if job.children else None
    return attempt_text(job.attempt, job.max_attempts, job.status, statuses)


def summary_html(job: ReportJob) -> str:
    tags = ", ".join(f"{k}={v}" for k, v in sorted(job.tags.items())) or "–"
    rows: list[tuple[str, Cell]] = [
        ("job", job.id),
        ("kind", job.kind),
        ("status", job.status),
        ("name", job.name),
        ("tags", tags),
        ("attempt", _attempts(job)),
        ("created", job.created_at),
        ("started", job.started_at),
        ("finished", job.finished_at),
    ]
    model = model_text(job)
    if model is not None:
        rows.insert(2, ("model", model))
    error = job.error
    if error is not None:
        rows.append(("error", f"{error.type}: {error.title or ''} {error.detail or ''}".strip()))
    body = "".join(
        f'<tr><th>{esc(k)}</th><td class="{"status-" + esc(v) if k == "status" else ""}">'
        f"{esc(_text(v))}</td></tr>"
        for k, v in rows
    )
    return f'<table class="summary">{body}</table>'


def model_text(job: JobJson | ReportJob) -> str | None:
    """What an analyze job measured (see :func:`curvplan.types.model_source.describe_model`)."""
    from curvplan.types.model_source import describe_model

    view = ReportJob.of(job)
    return describe_model(view.request, view.measured())


def budget_html(rec: Recommendation | None) -> str:
    """The budget, first on the page: the rows and notes of the shared budget summary (the
    CLI prints the same), with units and sources."""
    if rec is None or rec.budget is None:
        return _empty("No budget: the job has no recommendation (yet).")
    summary = budget_summary(rec.budget)
    body = []
    for r in summary.rows:
        value = r.value if isinstance(r.value, str) else _text(r.value)
        interval = ""
        if r.interval:
            low, high = r.interval
            interval = f"[{_text(low)}, {_text(high)}" + ("]" if r.closed else ")")
        label = f'<td class="sub">{esc(r.label)}</td>' if r.sub else f"<td>{esc(r.label)}</td>"
        body.append(
            f'<tr>{label}<td class="num">{esc(value)}</td><td>{esc(interval)}</td>'
            f"<td>{esc(r.note)}</td></tr>"
        )
    head = "".join(f"<th>{h}</th>" for h in ("", "value", "interval", "source / unit"))
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    items = "".join(
        f"<li>{esc(n.text if n.label is None else f'{n.label}: {n.text}')}</li>"
        for n in summary.notes
    )
    return f'<section id="budget">{table}<ul class="budget-notes">{items}</ul></section>'


def branch_html(job: ReportJob) -> str:
    """A branch sweep's table: per checkpoint the CBS, its bracket and each batch's excess
    loss over the smallest batch's; then the rule, the window and the warm-up schedule."""
    sweep = job.sweep()
    branch = sweep.branch if sweep is not None else None
    if branch is None:
        return ""
    sizes = branch.batch_sizes
    rows = []
    for c in branch.checkpoints:
        excess = {k.batch_size: k for k in c.curves}
        cells = [
            "failed"
            if b not in excess
            else f"{_text(excess[b].excess)}"
            + {True: " ✓", False: " ✗"}.get(excess[b].within_tolerance, "")  # type: ignore[arg-type]
            for b in sizes
        ]
        rows.append(
            (
                c.step,
                c.loss,
                c.critical_batch,
                c.status,
                c.next_batch,
                estimate_text(c.efficiency),
                estimate_text(c.crossing),
                *cells,
                "; ".join(c.notes),
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
    stages = [(s.from_step, s.batch_size, s.status) for s in branch.warmup_schedule]
    schedule = _table(("from step", "batch size", "CBS status"), stages, {0, 1})
    notes = [
        branch.rule,
        f"window: {_text(branch.window_tokens)} tokens "
        f"({branch.window_examples} examples) per branch",
        f"learning rate: {branch.lr_rule}",
        f"cost: {branch.examples_processed} examples processed in all",
        branch.schedule_note,
    ]
    items = "".join(f"<li>{esc(_text(n))}</li>" for n in notes if n)
    return (
        '<section id="branch-sweep"><h2>Branch sweep: critical batch size by checkpoint</h2>'
        f"{table}<h3>Batch-size warm-up schedule</h3>{schedule}<ul>{items}</ul></section>"
    )


def children_html(job: ReportJob) -> str:
    if not job.children:
        return ""
    rows = [(c.name, c.status, c.attempt, c.error_type, c.id) for c in job.children]
    return "<h2>Child jobs</h2>" + _table(("name", "status", "attempt", "error", "id"), rows, set())


def recommendation_html(job: ReportJob) -> str:
    rec, why = job.recommendation()
    if rec is None:
        has_one = job.result is not None and job.result.recommendation is not None
        return _empty(
            f"No recommendation: {why}"
            if has_one
            else f"No recommendation: the job is {job.status}."
        )
    parts = [
        _sample_size_html(rec.sample_size),
        _batch_html(rec.batch_size),
        _scaling_html(rec.scaling),
        _curvature_html(rec.curvature),
    ]
    if rec.warnings:
        rows = [(w.code, w.section, w.detail) for w in rec.warnings]
        parts.append("<h3>Warnings</h3>" + _table(("code", "section", "detail"), rows, set()))
    return "".join(parts)


def _k(value: SampleSizeValue | NotComputed | None) -> str:
    if not isinstance(value, SampleSizeValue):
        return "n/a"
    text = _text(value.k)
    if value.ci:
        text += " " + _text(value.ci)
    return text


def _not_computed(section: object) -> str | None:
    return section.reason if isinstance(section, NotComputed) else None


def _sample_size_html(section: SampleSizeSection | NotComputed | None) -> str:
    out = "<h3>Sample size (Δ_k curve; Petrov et al. 2025 Theorem 7)</h3>"
    if not isinstance(section, SampleSizeSection):
        return out + _empty(f"Not computed: {_not_computed(section)}")
    fit = section.fit
    if isinstance(fit, PowerLawFit):
        out += _table(
            ("C", "C interval", "α", "α interval", "r²", "fit window k", "theory α"),
            [(fit.C, fit.C_ci, fit.alpha, fit.alpha_ci, fit.r2, fit.window, fit.theory_alpha)],
            {0, 2, 4, 6},
        )
    else:
        out += _empty(f"Fit not computed: {fit.reason}")
    rows = [
        (
            t.tolerance,
            _k(t.empirical),
            _k(t.theoretical),
            _k(t.theoretical_tight),
            _k(t.squared),
            _k(t.evaluation_set_size),
        )
        for t in section.per_tolerance
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
    for m in section.missing:
        out += f'<p class="note">Missing {esc(m.item)}: {esc(m.reason)}</p>'
    return out


def _batch_html(section: BatchSizeSection | NotComputed | None) -> str:
    out = "<h3>Batch size (McCandlish et al. 2018)</h3>"
    if not isinstance(section, BatchSizeSection):
        return out + _empty(f"Not computed: {_not_computed(section)}")
    rows: list[tuple[Cell, ...]] = []
    for est, label in ((section.b_simple, "B_simple"), (section.b_noise, "B_noise")):
        if isinstance(est, Estimate):
            rows.append((label, est.value, est.ci))
        else:
            rows.append((label, "n/a", _not_computed(est)))
    crit = section.b_crit
    if isinstance(crit, BCrit):
        rows += [
            ("B_crit", crit.value, crit.ci),
            ("S_min (steps)", crit.s_min, crit.s_min_ci),
            ("E_min (examples)", crit.e_min, crit.e_min_ci),
        ]
    else:
        rows.append(("B_crit", "n/a", _not_computed(crit)))
    return out + _table(("quantity", "value", "interval / note"), rows, {1})


def _scaling_html(section: ScalingSection | NotComputed | None) -> str:
    out = "<h3>Data scaling L(D) = E + A·D^(−β)</h3>"
    if not isinstance(section, ScalingSection):
        return out + _empty(f"Not computed: {_not_computed(section)}")
    rows = [
        ("E", section.E, section.E_ci),
        ("A", section.A, section.A_ci),
        ("β", section.beta, section.beta_ci),
    ]
    return out + _table(("parameter", "value", "interval"), rows, {1})


def _curvature_html(section: CurvatureSection | NotComputed | None) -> str:
    out = "<h3>Curvature per block</h3>"
    if not isinstance(section, CurvatureSection):
        return out + _empty(f"Not computed: {_not_computed(section)}")
    rows = [
        (
            b.name,
            b.spectral_norm,
            b.lambda_max,
            b.lambda_min,
            f"{100 * b.share_of_total_norm:.1f}%",
            b.block_threshold,
        )
        for b in section.blocks
    ]
    if not rows:
        return out + _empty("No per-block measurements were given.")
    out += _table(
        ("block", "‖H_b‖₂", "λ_max", "λ_min", "share", "2/λ_max (block)"), rows, {1, 2, 3, 4, 5}
    )
    if section.heterogeneity_ratio is not None:
        out += (
            f'<p class="note">Heterogeneity ratio (max/min block norm): '
            f"{esc(_text(section.heterogeneity_ratio))}</p>"
        )
    return out


def abbreviate(value: JsonValue, max_items: int = 8) -> JsonValue:
    """``value`` with long lists cut to their first items plus a count (for display only)."""
    if isinstance(value, dict):
        return {k: abbreviate(v, max_items) for k, v in value.items()}
    if isinstance(value, list):
        head = [abbreviate(v, max_items) for v in value[:max_items]]
        if len(value) > max_items:
            head.append(f"… {len(value) - max_items} more")
        return head
    return value


def inputs_html(job: ReportJob) -> str:
    """The job's request (model spec, artifacts, options, targets), long arrays shortened."""
    if job.request is None:
        return _empty("The request is not available.")
    text = json.dumps(abbreviate(job.request), indent=2, ensure_ascii=False)
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


def render_report(job: JobJson | ReportJob, plots: list[Plot] | None = None) -> str:
    """The whole HTML document of a job's report (``plots``: the kept figures, else drawn)."""
    view = ReportJob.of(job)
    plots = build_plots(view) if plots is None else plots
    name = view.name or "unnamed job"
    title = f"curvplan report — {name}"
    sections = "".join(plot_html(p) for p in plots)
    rec, _ = view.recommendation()
    return (
        "<!DOCTYPE html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><p>{esc(view.kind)} job {esc(view.id)} · "
        f"{esc(view.status)}</p></header><main>"
        f"<h2>Budget</h2>{budget_html(rec)}"
        f"<h2>Summary</h2>{summary_html(view)}"
        f"{branch_html(view)}"
        f"{children_html(view)}"
        f"<h2>Inputs</h2>{inputs_html(view)}"
        f"<h2>Recommendation</h2>{recommendation_html(view)}"
        f"<h2>Plots</h2>{sections}"
        '<p class="note">Rendered by the curvplan service; figures drawn with matplotlib, '
        "also served as SVG and PNG under /v1/jobs/{id}/plots.</p>"
        "</main></body></html>"
    )
