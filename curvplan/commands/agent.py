"""``curvplan agent --command '…'``: train the points of the project's agent sweeps with your
own command, like ``wandb agent`` (docs/budget.md#sweeps-with-your-own-trainer)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from curvplan.commands.client import EXIT_BAD_INPUT, KEY_OPTION, URL_OPTION, _client, _fail

if TYPE_CHECKING:
    from curvplan.client.agents import AgentAPI
    from curvplan.types.agents import AgentJob


def _defaults(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise _fail(f"--default: expected NAME=VALUE, got {value!r}", EXIT_BAD_INPUT)
        out[name.strip()] = text
    return out


def agent(
    command: str = typer.Option(
        ...,
        "--command",
        help="The training command, run once per point without a shell; placeholders such as "
        "{batch_size} {data_size} {lr} {max_steps} {seed} {output_dir} {target_loss} are the "
        "point's values (docs/budget.md#the-command-template).",
    ),
    default: list[str] | None = typer.Option(
        None,
        "--default",
        help="NAME=VALUE for a placeholder a point has no value for (e.g. data_size=0 for the "
        "points of a batch sweep); repeatable.",
    ),
    out_dir: Path = typer.Option(
        Path("curvplan-agent-runs"),
        "--out-dir",
        help="Each attempt's {output_dir} is <out-dir>/<job id>-<attempt>.",
    ),
    count: int | None = typer.Option(
        None, "--count", min=1, help="Exit after this many points (default: run until stopped)."
    ),
    idle_exit: float | None = typer.Option(
        None,
        "--idle-exit",
        min=0,
        help="Exit after this many seconds without a point to train (default: wait on).",
    ),
    poll_interval: float = typer.Option(
        2.0, "--poll-interval", min=0.05, help="Seconds between claims while idle."
    ),
    lease_seconds: float | None = typer.Option(
        None,
        "--lease-seconds",
        min=1,
        max=3600,
        help="The lease of a claimed point (default: the service's); a killed agent's point "
        "is queued again once it runs out.",
    ),
    cancel_grace: float = typer.Option(
        10.0,
        "--cancel-grace-seconds",
        min=0,
        help="After SIGTERM (a cancel, the time limit, the agent stopping), SIGKILL the command "
        "after this many seconds.",
    ),
    url: str | None = URL_OPTION,
    api_key: str | None = KEY_OPTION,
) -> None:
    """Claim the points of this project's agent sweeps (`curvplan sweep … --runner agent`) and
    run COMMAND for each: heartbeats, cancel, time limit and retries as the service's workers
    do. The command reports its evaluation losses as JSON lines {"step", "loss", "examples"}
    on stdout or in $CURVPLAN_LOSS_FILE (curvplan.losslog.log_loss). SIGTERM or Ctrl-C stops
    the command and gives its point back."""
    from curvplan.agent.template import TemplateError, check_template

    defaults = _defaults(default)
    try:
        check_template(command, defaults)
    except TemplateError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    from curvplan.client._common import resolve_api_key

    if resolve_api_key(api_key) is None:
        raise _fail(
            "curvplan agent needs the API key of the project whose sweeps it trains: set "
            "CURVPLAN_API_KEY or pass --api-key (curvplan keys create --project NAME)",
            EXIT_BAD_INPUT,
        )
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with _client(url, api_key) as client:
            from curvplan.client.agents import AgentAPI
            from curvplan.client.errors import AuthenticationError

            try:
                api = AgentAPI(client, lease_seconds)
            except AuthenticationError as exc:
                raise _fail(
                    f"the service refused the API key ({exc.detail or exc}): curvplan agent "
                    "needs a key of the project whose sweeps it trains",
                    EXIT_BAD_INPUT,
                ) from None
            _log(
                f"agent {api.agent.id} of project {api.agent.project!r}: waiting for points of "
                "its agent sweeps (`curvplan sweep … --runner agent` with a key of this project)"
            )
            try:
                _loop(
                    api,
                    command,
                    defaults,
                    out_dir,
                    stopping,
                    count,
                    idle_exit,
                    poll_interval,
                    cancel_grace,
                )
            finally:
                api.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _log(message: str) -> None:
    typer.echo(f"[curvplan agent] {message}", err=True)


def _loop(
    api: AgentAPI,
    command: str,
    defaults: dict[str, str],
    out_dir: Path,
    stopping: threading.Event,
    count: int | None,
    idle_exit: float | None,
    poll_interval: float,
    cancel_grace: float,
) -> None:
    from curvplan.client.errors import ConnectionFailedError, ServerError

    done = 0
    idle_since = time.monotonic()
    while not stopping.is_set() and (count is None or done < count):
        try:
            job = api.claim()
        except (ConnectionFailedError, ServerError) as exc:  # the service is away: wait it out
            _log(f"claim failed, retrying in {max(poll_interval, 5.0):g} s: {exc}")
            stopping.wait(max(poll_interval, 5.0))
            continue
        if job is None:
            if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                _log(f"no point for {idle_exit:g} s: exiting")
                return
            stopping.wait(poll_interval)
            continue
        _run_one(api, job, command, defaults, out_dir, stopping, cancel_grace)
        done += 1
        idle_since = time.monotonic()


def _run_one(
    api: AgentAPI,
    job: AgentJob,
    command: str,
    defaults: dict[str, str],
    out_dir: Path,
    stopping: threading.Event,
    cancel_grace: float,
) -> None:
    from curvplan.agent.run import Outcome, run_point
    from curvplan.agent.template import TemplateError, point_values, render
    from curvplan.client.errors import (
        ConflictError,
        ConnectionFailedError,
        NotFoundError,
        ServerError,
    )

    output_dir = (out_dir / f"{job.job_id}-{job.attempt}").resolve()
    label = f"point {job.name or job.job_id} (job {job.job_id}, attempt {job.attempt})"
    try:
        argv = render(command, point_values(job, output_dir), defaults)
    except TemplateError as exc:
        outcome = Outcome(
            "failed",
            error_type="invalid-command",
            title="The agent's command does not fit the point",
            detail=str(exc),
        )
    else:
        _log(f"{label}: {' '.join(argv)}")
        outcome = run_point(
            api, job, argv, output_dir, stopping=stopping, cancel_grace=cancel_grace, log=_log
        )
    try:
        if outcome.ended == "succeeded":
            end = api.complete(job, outcome.records, outcome.seconds)
        elif outcome.ended in ("failed", "retry"):
            retry = outcome.ended == "retry"
            end = api.fail(job, outcome.error_type, outcome.title, outcome.detail, retry=retry)
        elif outcome.ended == "cancelled":
            end = api.cancelled(job)
        elif outcome.ended == "released":
            end = api.release(job)
        else:
            _log(f"{label}: the lease was lost; the attempt is dropped")
            return
    except (ConflictError, NotFoundError) as exc:
        _log(f"{label}: not recorded, the lease was lost: {exc.detail or exc}")
        return
    except (ConnectionFailedError, ServerError) as exc:
        _log(f"{label}: not recorded ({exc}); the point is queued again when its lease runs out")
        return
    detail = f" ({outcome.error_type}: {outcome.detail.splitlines()[0]})" if outcome.detail else ""
    _log(f"{label}: {outcome.ended} in {outcome.seconds:.1f} s → the point is {end.status}{detail}")
    sys.stderr.flush()


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
