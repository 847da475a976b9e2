"""One attempt's child process, seen from the worker parent."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any, Literal

from curvplan_core.jobs.records import ProgressRecord
from curvplan_worker.child import ChildTask, child_main
from curvplan_worker.exit_codes import EXIT_RANK_DIED, EXIT_WORKER_GONE
from curvplan_worker.kinds import modules_for_queues


def make_context(start_method: str, queues: list[str]) -> BaseContext:
    """A multiprocessing context for attempt children.

    With ``forkserver`` (the default) the server preloads the kind modules of
    ``queues`` (numpy, scipy, the planner; torch only for a gpu queue's kinds) once,
    and each attempt child is forked from it in milliseconds. The worker parent
    itself never imports those modules.
    """
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        # Each child re-runs the parent's main module (multiprocessing's "prepare"
        # step; Python 3.11's forkserver cannot preload a main *script*). Preloading
        # the CLI module (what the ``curvplan`` console script imports) and the main
        # module's name (``python -m``) leaves only the main body to re-run, cheaply.
        main_spec = getattr(sys.modules["__main__"], "__spec__", None)
        main_modules = ["curvplan.cli"] + ([main_spec.name] if main_spec is not None else [])
        ctx.set_forkserver_preload(
            [*dict.fromkeys(main_modules), "curvplan_worker.child", *modules_for_queues(queues)]
        )
    return ctx


@dataclass(frozen=True)
class Progress:
    fraction: float
    stage: str
    message: str
    #: Seconds the attempt still needs, by its own estimate (None: no estimate yet).
    eta_seconds: float | None = None

    def as_dict(self) -> ProgressRecord:
        out: ProgressRecord = {
            "fraction": self.fraction,
            "stage": self.stage,
            "message": self.message,
        }
        if self.eta_seconds is not None:
            out["eta_seconds"] = self.eta_seconds
        return out


@dataclass(frozen=True)
class MemoryReport:
    """The child's device memory, ``{device: {allocated, reserved, peak}}`` (bytes)."""

    devices: dict[str, dict[str, int]]


@dataclass(frozen=True)
class Final:
    """How the child said the attempt ended: ``result``, ``error``, ``cancelled``, ``retry``
    (a transient failure) or ``fan-out`` (children to create before the job resumes)."""

    kind: str
    payload: Mapping[str, Any] | None = None


KillKind = Literal["kernel-oom", "suspected-oom", "external-kill"]


def classify_kill(exitcode: int | None, oom_kills: int | None) -> KillKind | None:
    """What ended a child the supervisor did not kill itself (docs/operations.md#oom-kills).

    ``oom_kills``: the increase of the ``oom_kill`` counters of the child's memory cgroups
    while it ran (``memstats.OomWatch``; None where no cgroup reports them). Only SIGKILL
    counts: the kernel's out-of-memory killer sends nothing else.

    * ``kernel-oom``: SIGKILL and the counter rose: the OOM killer ended it;
    * ``suspected-oom``: SIGKILL where no counter can tell: most likely the OOM killer, so it
      is treated as one (a retry as is would only meet it again);
    * ``external-kill``: SIGKILL and the counters stayed put: someone else's kill (an
      operator's ``kill -9``), a crash like any other;
    * None: not a SIGKILL.
    """
    if exitcode != -signal.SIGKILL:
        return None
    if oom_kills is None:
        return "suspected-oom"
    return "kernel-oom" if oom_kills > 0 else "external-kill"


def describe_exit(exitcode: int | None) -> str:
    """Human words for a child's exit code (negative: killed by a signal)."""
    if exitcode is None:
        return "the process did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the out-of-memory killer sends SIGKILL)" if -exitcode == signal.SIGKILL else ""
        return f"the job's process was killed by {name}{hint}"
    if exitcode == EXIT_WORKER_GONE:
        return "the job's process exited because its worker went away"
    if exitcode == EXIT_RANK_DIED:
        return "a data-parallel rank of the job died or stopped answering; all ranks were ended"
    return f"the job's process exited with code {exitcode} without reporting a result"


class AttemptProcess:
    """Start the child for ``task`` and talk to it: progress, final message, cancel, kill."""

    def __init__(self, mp_context: BaseContext, task: ChildTask) -> None:
        self._results, results_w = mp_context.Pipe(duplex=False)
        lifeline_r, self._lifeline = mp_context.Pipe(duplex=False)
        self.cancel_event = mp_context.Event()
        self.process = mp_context.Process(  # type: ignore[attr-defined]
            target=child_main,
            args=(task, results_w, lifeline_r, self.cancel_event, self._lifeline.fileno()),
            name=f"curvplan-attempt-{task.job_id}-{task.attempt}",
        )
        self.process.start()
        # Keep only our ends, so EOF on either pipe means the other side is gone.
        results_w.close()
        lifeline_r.close()
        self.pid: int = self.process.pid
        self._eof = False

    def receive(self, timeout: float) -> list[Progress | MemoryReport | Final]:
        """Messages that arrive within ``timeout`` seconds (empty list if none)."""
        messages: list[Progress | MemoryReport | Final] = []
        if self._eof:
            return messages
        if not self._results.poll(timeout):
            return messages
        while not self._eof and self._results.poll(0):
            try:
                message = self._results.recv()
            except (EOFError, OSError):
                self._eof = True
                break
            tag = message[0]
            if tag == "progress":
                messages.append(Progress(*message[1:]))
            elif tag == "memory":
                messages.append(MemoryReport(message[1]))
            elif tag in ("result", "error", "fan-out", "retry"):
                messages.append(Final(tag, message[1]))
            elif tag == "cancelled":
                messages.append(Final("cancelled"))
        return messages

    @property
    def finished_talking(self) -> bool:
        """True once the child closed its end of the result pipe (it exited or is exiting)."""
        return self._eof

    def request_cancel(self) -> None:
        """Ask the kind to stop at its next progress report."""
        self.cancel_event.set()

    def kill(self) -> None:
        """SIGKILL the child (no clean-up needed: it holds no database state)."""
        if self.process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def join(self, timeout: float | None = None) -> int | None:
        """Wait for the child to exit; its exit code (None if still running)."""
        self.process.join(timeout)
        return self.process.exitcode

    def close(self) -> None:
        """Release the pipes (closing the lifeline makes a still-running child exit)."""
        self._lifeline.close()
        self._results.close()
        if self.process.exitcode is not None:
            self.process.close()
