"""The report page of a real job, opened in headless Chromium through a signed link."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from chromium import SvgCensus, find_chromium, png_size, run_chromium
from live_plugin import LiveService
from plan_bodies import full_measurements, full_targets

import curvplan

pytestmark = pytest.mark.e2e

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
DRAWN_PLOTS = ("delta-curve", "block-norms", "batch-size", "loss-vs-data")
EMPTY_PLOTS = ("off-diagonal", "bounds")


@pytest.fixture(scope="module")
def browser() -> str:
    binary = find_chromium()
    if binary is None:
        pytest.skip(
            "Chromium is not installed: the set-up (`make install`, run by `make test`) "
            "installs it with scripts/ensure_chromium.sh where apt-get may run"
        )
    return binary


def test_console_detection_sees_errors(browser: str, tmp_path: Path) -> None:
    """Control: the console check below would catch an error if the page had one."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><script>console.error("planted-error")</script>')
    run = run_chromium(browser, page.as_uri(), "--dump-dom")
    assert any("planted-error" in line for line in run.console), run.console


def test_report_page_in_chromium(browser: str, live: LiveService) -> None:
    with curvplan.Client(live.url, live.api_key) as api:
        name = f"report <b>{uuid.uuid4().hex[:6]}</b>"
        job = api.submit_plan(full_measurements(), full_targets(), name=name)
        assert api.wait(job.id, timeout=90).status == "succeeded"
        link = api.report_link(job.id)
    assert link.url.startswith(live.url)

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{job.id}.png"
    shot.unlink(missing_ok=True)
    run = run_chromium(browser, link.url, f"--screenshot={shot}", "--window-size=1280,4200")
    assert png_size(shot) == (1280, 4200) and shot.stat().st_size > 50_000  # a real picture
    assert run.console == [], run.console  # no errors, no CSP violations, no failed loads

    dom = run_chromium(browser, link.url, "--dump-dom")
    assert dom.console == [], dom.console
    census = SvgCensus()
    census.feed(dom.stdout)
    assert "&lt;b&gt;" in dom.stdout and "<b>" not in dom.stdout  # the name stayed text
    for pid in DRAWN_PLOTS:
        assert census.svgs.get(pid, 0) > 20, (pid, census.svgs)  # present and drawn
    for pid in EMPTY_PLOTS:
        assert pid not in census.svgs
    assert sum("analyze" in note for note in census.empty_notes) == len(EMPTY_PLOTS)
    assert census.active == []  # no script, image, frame or stylesheet link
    (ARTIFACTS / f"report-{job.id}.html").write_text(dom.stdout)


def test_analyze_report_renders_every_plot_kind(
    browser: str, analyze_job: dict, analyze_plots: list, tmp_path: Path
) -> None:
    """Heatmaps and the measured-vs-bound chart (analyze jobs) in the browser too."""
    from curvplan_server.reports.page import render_report

    page = tmp_path / "analyze-report.html"
    page.write_text(render_report(analyze_job, analyze_plots))
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-analyze-synthetic.png"
    shot.unlink(missing_ok=True)
    run = run_chromium(browser, page.as_uri(), f"--screenshot={shot}", "--window-size=1280,4600")
    assert png_size(shot) == (1280, 4600) and run.console == [], run.console
    dom = run_chromium(browser, page.as_uri(), "--dump-dom")
    census = SvgCensus()
    census.feed(dom.stdout)
    assert dom.console == [] and census.active == []
    for pid in ("delta-curve", "block-norms", "off-diagonal", "bounds", "batch-size"):
        assert census.svgs.get(pid, 0) > 10, (pid, census.svgs)
    assert "loss-vs-data" not in census.svgs and "noise-trend" not in census.svgs
    assert len(census.empty_notes) == 2  # no loss_vs_data, no noise-scale trend
