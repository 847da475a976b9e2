"""One claimed point: run the command, beat, forward a cancel, enforce the time limit, and say
how the attempt ended (:class:`Outcome`), with the evaluations the command reported.

The command runs without a shell in a session of its own, with ``$CURVPLAN_LOSS_FILE`` naming
``<output_dir>/losses.jsonl``; its evaluations are the JSON lines ``{"step", "loss"[, "examples",
"tokens"]}`` it writes to that file or to stdout (:mod:`curvplan.losslog`). Stopping it (a cancel,
the time limit, the agent's own SIGTERM, a lost lease) sends SIGTERM to its process group, then
SIGKILL after ``cancel_grace`` seconds. On Linux the command also gets SIGKILL when the agent
dies (``PR_SET_PDEATHSIG``), so a killed agent leaves no run behind that could report twice.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, Protocol

from pydantic import ValidationError

from curvplan.losslog import LOSS_FILE_ENV
from curvplan.types.agents import AgentHeartbeatOut, AgentJob, AgentProgress, LossRecord

STDERR_LINES = 20
"""The last lines of the command's stderr a failed point's error carries."""

Ended = Literal["succeeded", "failed", "retry", "cancelled", "released", "lost"]


class Beater(Protocol):
    """What a run needs of the agent's API: the fenced heartbeat (raises on a lost lease)."""

    @property
    def heartbeat_seconds(self) -> float: ...

    def heartbeat(self, job: AgentJob, progress: AgentProgress | None) -> AgentHeartbeatOut: ...


@dataclass
class Outcome:
    """How the attempt ended, and what to report."""

    ended: Ended
    records: list[LossRecord] = field(default_factory=list)
    seconds: float = 0.0
    error_type: str = ""
    title: str = ""
    detail: str = ""


@dataclass
class _Records:
    """The evaluations read so far (stdout and the loss file), and what was wrong with any."""

    records: list[LossRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    diverged: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def offer(self, line: str) -> bool:
        """Take ``line`` if it is a loss record (True), else leave it (False)."""
        text = line.strip()
        if not text.startswith("{"):
            return False
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        if not isinstance(doc, dict) or "step" not in doc or "loss" not in doc:
            return False
        with self.lock:
            loss = doc.get("loss")
            if isinstance(loss, int | float) and not math.isfinite(loss):
                self.diverged = self.diverged or f"step {doc.get('step')}: loss {loss}"
                return True
            try:
                self.records.append(LossRecord.model_validate(doc))
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(map(str, first["loc"]))
                self.problems.append(f"{text[:200]}: {where}: {first['msg']}")
        return True

    def last(self) -> LossRecord | None:
        with self.lock:
            return max(self.records, key=lambda r: r.step) if self.records else None


class _LossFile:
    """Reads the complete lines the command appended to its loss file since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""

    def read(self, records: _Records, final: bool = False) -> None:
        try:
            with self.path.open("r", encoding="utf-8", errors="replace") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
                self.offset = fh.tell()
        except FileNotFoundError:
            return
        lines = (self.partial + chunk).split("\n")
        self.partial = "" if final else lines.pop()
        for line in lines:
            records.offer(line)


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Ask Linux to SIGKILL this process when the agent dies (``prctl(PR_SET_PDEATHSIG)``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _pump(stream: IO[str], take: Callable[[str], None]) -> threading.Thread:
    def run() -> None:
        for line in stream:
            take(line)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _signal_group(proc: subprocess.Popen[str], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def run_point(
    api: Beater,
    job: AgentJob,
    argv: list[str],
    output_dir: Path,
    *,
    stopping: threading.Event,
    cancel_grace: float,
    log: Callable[[str], None],
    poll: float = 0.1,
) -> Outcome:
    """Run ``argv`` for ``job`` until it exits, heartbeating every ``api.heartbeat_seconds``;
    the outcome to report (``lost``: report nothing, the lease is gone)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    loss_file = _LossFile(output_dir / "losses.jsonl")
    loss_file.path.unlink(missing_ok=True)  # only this run's records count
    env = {k: v for k, v in os.environ.items() if k != "CURVPLAN_API_KEY"}
    env |= {
        LOSS_FILE_ENV: str(loss_file.path),
        "CURVPLAN_JOB_ID": str(job.job_id),
        "CURVPLAN_ATTEMPT": str(job.attempt),
    }
    records = _Records()
    stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # the pumps of earlier runs have ended
        )
    except OSError as exc:
        return Outcome(
            "failed",
            error_type="command-not-started",
            title="The agent's command did not start",
            detail=f"{argv[0]}: {exc}",
        )

    def take_stdout(line: str) -> None:
        if not records.offer(line):
            sys.stdout.write(line)
            sys.stdout.flush()

    def take_stderr(line: str) -> None:
        stderr_tail.append(line.rstrip("\n"))
        sys.stderr.write(line)
        sys.stderr.flush()

    assert proc.stdout is not None and proc.stderr is not None
    pumps = [_pump(proc.stdout, take_stdout), _pump(proc.stderr, take_stderr)]
    stop: Ended | Literal["timeout"] | None = None
    killed_at: float | None = None
    next_beat = 0.0
    while proc.poll() is None:
        now = time.monotonic()
        if stop is None:
            if stopping.is_set():
                stop = "released"
            elif now - started > job.time_limit_seconds:
                stop = "timeout"
        if stop is None and now >= next_beat:
            loss_file.read(records)
            stop = _beat(api, job, records, log)
            next_beat = now + api.heartbeat_seconds
        if stop is not None and killed_at is None:
            log(f"stopping the command ({stop}): SIGTERM")
            _signal_group(proc, signal.SIGTERM)
            killed_at = now
        elif killed_at is not None and now - killed_at > cancel_grace:
            log(f"the command outlived the grace of {cancel_grace:g} s: SIGKILL")
            _signal_group(proc, signal.SIGKILL)
            killed_at = math.inf
        time.sleep(poll)
    for pump in pumps:
        pump.join(timeout=5)
    loss_file.read(records, final=True)
    seconds = time.monotonic() - started
    return _outcome(argv, proc.returncode, stop, records, list(stderr_tail), seconds, job)


def _beat(
    api: Beater, job: AgentJob, records: _Records, log: Callable[[str], None]
) -> Ended | None:
    from curvplan.client.errors import ConflictError, CurvplanError, NotFoundError

    last = records.last()
    progress = AgentProgress(stage="training", message="the agent's command runs")
    if last is not None:
        progress = AgentProgress(
            stage="training",
            message=f"step {last.step}, eval loss {last.loss:.4g}",
            fraction=min(max(last.step / max(job.point.max_steps, 1), 0.0), 1.0),
        )
    try:
        beat = api.heartbeat(job, progress)
    except (ConflictError, NotFoundError) as exc:
        log(f"lease lost: {exc}")
        return "lost"
    except CurvplanError as exc:  # the service is away: keep running, the next beat retries
        log(f"heartbeat failed (will retry): {exc}")
        return None
    return "cancelled" if beat.cancel_requested else None


def _outcome(
    argv: list[str],
    returncode: int,
    stop: Ended | Literal["timeout"] | None,
    records: _Records,
    stderr_tail: list[str],
    seconds: float,
    job: AgentJob,
) -> Outcome:
    tail = "\n".join(stderr_tail)
    stderr = (
        f"; the last {len(stderr_tail)} lines of its stderr:\n{tail}"
        if stderr_tail
        else "; it wrote nothing to stderr"
    )
    if stop == "timeout":
        return Outcome(
            "failed",
            seconds=seconds,
            error_type="timeout",
            title="The agent's command ran past the time limit",
            detail=f"stopped after {seconds:.0f} s, over the limit of "
            f"{job.time_limit_seconds:g} s (CURVPLAN_JOB_TIME_LIMITS, sweep_point){stderr}",
        )
    if stop is not None:
        return Outcome(stop, seconds=seconds)
    if returncode > 0:
        return Outcome(
            "failed",
            seconds=seconds,
            error_type="command-failed",
            title="The agent's command exited with an error",
            detail=f"`{' '.join(argv)}` exited with status {returncode}{stderr}",
        )
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else ""
        return Outcome(
            "retry",
            seconds=seconds,
            error_type="command-killed",
            title="The agent's command was killed by a signal",
            detail=f"`{' '.join(argv)}` was killed by signal {-returncode} {name}".rstrip()
            + stderr,
        )
    if records.diverged is not None:
        return Outcome(
            "failed",
            seconds=seconds,
            error_type="diverged",
            title="The training run diverged",
            detail=f"the command reported a non-finite evaluation loss ({records.diverged})",
        )
    if records.problems:
        return Outcome(
            "failed",
            seconds=seconds,
            error_type="invalid-loss-record",
            title="The command reported an invalid loss record",
            detail="; ".join(records.problems[:5]),
        )
    if not records.records:
        return Outcome(
            "failed",
            seconds=seconds,
            error_type="no-losses",
            title="The command reported no evaluation loss",
            detail='it exited 0 without one JSON line {"step": …, "loss": …} on stdout or in '
            f"${LOSS_FILE_ENV} (curvplan.losslog.log_loss writes them){stderr}",
        )
    return Outcome("succeeded", records=list(records.records), seconds=seconds)
