"""``--wait`` on a fan-out: the line shows the running children's stages and their ETA (a
real analyze fanned out into two ``analyze_blocks`` children on the live service)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from analyze_files import option_flags, write_analyze_files
from cli_helpers import run_cli
from live_plugin import LiveService

from curvplan.types.jobs import attempt_text

EXAMPLES = 600

WAITING = re.compile(r"waiting for children: (\d) of 2 points done(?P<eta>  \(≈ [^)]+\))? · "
                     r"running: (?P<child>blocks [12]/2)( \((?P<stage>[^)]+)\))?$")  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_wait_shows_the_running_childrens_stages_and_eta(live: LiveService, tmp_path: Path) -> None:
    """Through a pipe (one line per change) the waiting parent's lines name the running child
    and the engine stage it reported, and once that child has measured its first product its
    ETA; the parent itself reports neither."""
    # enough examples that each child's spectra outlast several of the client's 1 s polls
    files = write_analyze_files(tmp_path, n_examples=EXAMPLES)
    args = [
        "analyze", "--spec", str(files["spec"]), "--checkpoint", str(files["checkpoint"]),
        "--data", str(files["data"]), "--name", f"wait-children-{uuid.uuid4().hex[:6]}",
        *option_flags(), "--option", "fan_out=true", "--option", "fan_out_groups=2", "--wait",
    ]  # fmt: skip
    run = run_cli(args, live.client_env(), timeout=300)
    assert run.code == 0, run.stderr + live.logs()
    lines = [m for line in run.stderr.splitlines() if (m := WAITING.search(line))]
    assert lines, run.stderr
    # one worker: the children run one after the other, each named while it runs
    assert [m["child"] for m in lines] == sorted(m["child"] for m in lines), run.stderr
    # fanned out at submission the parent's own ETA (its slowest child's plus its fan-in's)
    # leads the line; a child's engine stage is not asserted here (the children now finish
    # within one of the client's polls)
    assert any(m["eta"] for m in lines), run.stderr
    # a clean fan-out and fan-in: one attempt of three, plus the fan-in (not "2/4")
    job_id = re.search(r"job (\S+) submitted", run.stderr)[1]  # type: ignore[index]
    shown = run_cli(["jobs", "show", job_id], live.client_env())
    assert shown.code == 0, shown.stderr
    # fanned out at submission: the fan-in is the parent's one attempt
    assert re.search(r"^attempt +1/3$", shown.stdout, re.M), shown.stdout


@pytest.mark.parametrize(
    ("attempt", "most", "status", "children", "text"),
    [
        (2, 4, "succeeded", ["succeeded", "succeeded"], "1/3 + fan-in"),
        (3, 4, "succeeded", ["succeeded", "failed"], "2/3 + fan-in"),  # fan-out retried once
        (1, 3, "running", ["succeeded", "running"], "1/3"),  # still waiting
        (2, 3, "succeeded", None, "2/3"),  # no fan-out: a retry is a retry
        (2, 3, "cancelled", ["cancelled", "cancelled"], "2/3"),  # cancelled while waiting
    ],
)
def test_attempt_text(attempt: int, most: int, status: str, children, text: str) -> None:
    assert attempt_text(attempt, most, status, children) == text
