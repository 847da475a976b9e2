"""The attempt child protocol: progress, results, errors, cooperative cancel, crashes.

Each test starts a real child process (``fork`` context, so the test-only kind
registered here is visible in the child) and reads what it reports through the pipe.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from attempt_test_kinds import AttemptRequest, AttemptResult

from curvplan_worker.attempt import AttemptProcess, Final, Progress, describe_exit
from curvplan_worker.child import ChildTask
from curvplan_worker.exit_codes import EXIT_WORKER_GONE
from curvplan_worker.kinds import KINDS, KindSpec

FORK = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def test_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        KINDS,
        "test",
        KindSpec(
            name="test",
            queue="cpu",
            module="attempt_test_kinds",
            request_type=AttemptRequest,
            result_type=AttemptResult,
        ),
    )


def start(
    behaviour: str, tmp_path: Path, task_fields: dict[str, Any] | None = None, **request: Any
) -> AttemptProcess:
    task = ChildTask(
        **(task_fields or {}),
        kind="test",
        job_id="7f0c3c1e-0000-4000-8000-000000000001",
        attempt=2,
        worker_id="w-test",
        request_json=json.dumps({"behaviour": behaviour, **request}),
        data_dir=str(tmp_path),
        log_format="json",
        log_level="WARNING",
    )
    return AttemptProcess(FORK, task)


def collect(child: AttemptProcess, timeout: float = 10.0) -> tuple[list[Progress], Final | None]:
    progress: list[Progress] = []
    final = None
    deadline = time.monotonic() + timeout
    while not child.finished_talking and time.monotonic() < deadline:
        for message in child.receive(0.05):
            if isinstance(message, Progress):
                progress.append(message)
            else:
                final = message
    return progress, final


def test_progress_and_result_reach_the_parent(tmp_path):
    child = start("progress", tmp_path)
    progress, final = collect(child)
    assert child.join(5) == 0
    assert [(p.fraction, p.stage) for p in progress] == [
        (0.0, "stage-0"),
        (0.5, "stage-1"),
        (1.0, "stage-2"),
    ]
    assert final == Final(
        "result",
        {
            "job_id": "7f0c3c1e-0000-4000-8000-000000000001",
            "attempt": 2,
            "data_dir": str(tmp_path),
        },
    )
    child.close()


def test_cooperative_cancel_stops_the_kind_at_its_next_progress_report(tmp_path):
    child = start("cooperative", tmp_path, seconds=30)
    # until its first report (a fixed 0.3 s can be too short for a child a loaded machine starts
    # late), so the cancel lands in its loop
    progress: list[Progress] = []
    deadline = time.monotonic() + 30
    while not progress and time.monotonic() < deadline:
        progress += collect(child, timeout=0.1)[0]
    assert progress, "the kind should be reporting progress"
    asked = time.monotonic()
    child.request_cancel()
    _, final = collect(child)
    assert final == Final("cancelled")
    assert child.join(5) == 0
    # it stopped at a report (every 10 ms), it did not run its 30 s: a bound far from both,
    # for a loaded machine
    assert time.monotonic() - asked < 10.0
    child.close()


@pytest.mark.parametrize(
    ("behaviour", "error_type", "detail_check"),
    [
        ("job-error", "invalid-request", lambda d: d == "measurements.x: bad"),
        ("exception", "internal-error", lambda d: d.startswith("RuntimeError: boom")),
        ("not-json", "internal-error", lambda d: d.startswith("ValueError")),
        (
            "not-the-result-model",
            "internal-error",
            lambda d: d == "TypeError: the result is a dict, not a AttemptResult",
        ),
        ("bad-progress", "internal-error", lambda d: "[0, 1]" in d),
    ],
)
def test_errors_become_job_errors_without_traceback(tmp_path, behaviour, error_type, detail_check):
    child = start(behaviour, tmp_path)
    _, final = collect(child)
    assert child.join(5) == 0
    assert final is not None and final.kind == "error"
    error = final.payload
    assert error is not None and error["type"] == error_type
    assert set(error) == {"type", "title", "detail"}
    assert detail_check(error["detail"]), error["detail"]
    assert len(error["detail"]) <= 300 and "Traceback" not in error["detail"]
    child.close()


@pytest.mark.parametrize(
    ("behaviour", "exitcode", "words"),
    [("exit", 3, "exited with code 3"), ("segfault", -signal.SIGSEGV, "SIGSEGV")],
)
def test_a_crash_ends_without_a_final_message(tmp_path, behaviour, exitcode, words):
    child = start(behaviour, tmp_path)
    _, final = collect(child)
    assert final is None
    code = child.join(5)
    assert code == exitcode
    assert words in describe_exit(code)
    child.close()


def test_killed_child_is_reported_as_sigkill(tmp_path):
    child = start("sleep", tmp_path, seconds=30)
    os.kill(child.pid, signal.SIGKILL)
    _, final = collect(child)
    assert final is None
    code = child.join(5)
    assert code == -signal.SIGKILL
    assert "SIGKILL" in describe_exit(code) and "out-of-memory" in describe_exit(code)
    child.close()


def test_child_exits_when_its_worker_goes_away(tmp_path):
    """Closing the lifeline (what the OS does when the worker dies) ends the child at once."""
    child = start("sleep", tmp_path, seconds=30)
    time.sleep(0.2)
    child._lifeline.close()
    assert child.join(5) == EXIT_WORKER_GONE
    child._results.close()


def test_a_transient_failure_asks_for_a_retry_not_a_job_error(tmp_path):
    child = start("transient", tmp_path)
    _, final = collect(child)
    assert child.join(5) == 0
    assert final is not None and final.kind == "retry"
    assert final.payload is not None and final.payload["type"] == "transient-error"
    assert "ConnectError" in final.payload["detail"]
    child.close()


def test_the_worker_key_reaches_the_child_through_the_pipe_and_never_its_repr(tmp_path):
    import hashlib

    key = "cpo_" + "k" * 43
    fields = {"api_url": "http://api.example:8000", "api_key": key}
    child = start("api", tmp_path, task_fields=fields)
    _, final = collect(child)
    assert child.join(5) == 0
    assert final == Final(
        "result",
        {
            "api_url": "http://api.example:8000",
            "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
        },
    )
    task = ChildTask(
        kind="test",
        job_id="j",
        attempt=1,
        worker_id="w",
        request_json="{}",
        data_dir=".",
        log_format="json",
        log_level="INFO",
        **fields,
    )
    assert key not in repr(task)
    child.close()
