"""The CLI's terminal output: rich draws the tables and the progress bar on a terminal;
anywhere else the output stays the plain text scripts parse. Brackets in cells and messages
(``[mlflow]``, intervals) print as they are: nothing is read as rich markup."""

from __future__ import annotations

import io
import re
import uuid
from datetime import UTC, datetime

from curvplan.client import models as m
from curvplan.client.display import ProgressDisplay, table

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ROWS = [["extra [mlflow]", "[365, 691]", 0.5], ["plain", None, 3]]


def _job(status: str, fraction: float | None, message: str) -> m.JobOut:
    now = datetime.now(UTC)
    return m.JobOut.model_validate(
        {
            "id": str(uuid.uuid4()),
            "kind": "plan",
            "queue": "cpu",
            "status": status,
            "name": None,
            "tags": {},
            "progress": {"fraction": fraction, "stage": "plan", "message": message},
            "attempt": 1,
            "max_attempts": 3,
            "cancel_requested": False,
            "result": None,
            "error": None,
            "created_at": now,
            "updated_at": now,
            "started_at": now,
            "finished_at": now if status == "succeeded" else None,
            "links": {"self": "/x", "cancel": "/x", "recommendation": "/x"},
        }
    )


def test_a_plain_table_is_aligned_columns_and_the_default_off_a_terminal() -> None:
    plain = table(["NAME", "INTERVAL", "VALUE"], ROWS, styled=False)
    assert plain.splitlines() == [
        "NAME            INTERVAL    VALUE",
        "--------------  ----------  -----",
        "extra [mlflow]  [365, 691]  0.5",
        "plain           -           3",
    ]
    assert table(["NAME", "INTERVAL", "VALUE"], ROWS) == plain  # pytest's stdout: no terminal


def test_a_terminal_table_is_drawn_by_rich_and_keeps_every_bracket() -> None:
    drawn = table(["NAME", "INTERVAL", "VALUE"], ROWS, styled=True)
    assert ANSI.search(drawn) and ("━" in drawn or "─" in drawn)  # styled header, a rule
    text = ANSI.sub("", drawn)
    rows = [line.split() for line in text.splitlines() if line.strip()]
    assert rows[0] == ["NAME", "INTERVAL", "VALUE"]
    assert ["extra", "[mlflow]", "[365,", "691]", "0.5"] in rows
    assert ["plain", "-", "3"] in rows


def test_the_progress_bar_redraws_in_place_on_a_terminal_and_ends_with_the_cursor() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, tty=True)
    display(_job("running", 0.3, "fitting [mlflow] logging"))
    display(_job("succeeded", 1.0, "done"))
    text = out.getvalue()
    plain = ANSI.sub("", text)
    assert " 30%" in plain and "fitting [mlflow] logging" in plain
    assert "100%" in plain and "succeeded" in plain and "━" in plain
    assert plain.endswith("\n") and "\x1b[?25h" in text  # a last newline, the cursor back
    display.close()  # nothing left to stop: a second close is harmless


def test_the_progress_off_a_terminal_is_one_plain_line_per_change() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, tty=False)
    job = _job("running", 0.3, "fitting [mlflow]")
    display(job)
    assert out.getvalue() == f"job {job.id} running 30% plan: fitting [mlflow]\n"
    assert not ANSI.search(out.getvalue())
