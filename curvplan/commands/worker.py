"""Worker command: ``curvplan worker --queues cpu,gpu``."""

from __future__ import annotations

import typer


def _parse_queues(value: str) -> list[str]:
    queues = [q.strip() for q in value.split(",") if q.strip()]
    unknown = sorted(set(queues) - {"cpu", "gpu"})
    if not queues or unknown:
        raise typer.BadParameter(f"queues are a comma-separated subset of cpu,gpu; got {value!r}")
    return list(dict.fromkeys(queues))


def worker(
    queues: str = typer.Option("cpu", "--queues", help="Comma-separated queues: cpu, gpu."),
    concurrency: int = typer.Option(
        1, "--concurrency", min=1, help="Jobs run at once (one per slot); use 1 per GPU."
    ),
    lease_seconds: float | None = typer.Option(
        None, "--lease-seconds", min=0.1, help="Lease length (default: CURVPLAN_LEASE_SECONDS, 30)."
    ),
    heartbeat_seconds: float | None = typer.Option(
        None,
        "--heartbeat-seconds",
        min=0.01,
        help="Heartbeat period (default: lease/3, at most CURVPLAN_HEARTBEAT_SECONDS).",
    ),
    poll_interval: float | None = typer.Option(
        None, "--poll-interval", min=0.01, help="Seconds between claims when idle (default: 1)."
    ),
    cancel_grace_seconds: float | None = typer.Option(
        None, "--cancel-grace-seconds", min=0, help="Kill a job that ignores cancel this long."
    ),
    shutdown_grace_seconds: float | None = typer.Option(
        None, "--shutdown-grace-seconds", min=0, help="Wait this long for the job at SIGTERM."
    ),
) -> None:
    """Claim and run jobs of QUEUES until SIGTERM/SIGINT (finish or release the running job)."""
    from curvplan_server.config import get_settings
    from curvplan_worker.worker import WorkerOptions, run_worker

    settings = get_settings()
    if settings.database_url is None:
        raise typer.BadParameter(
            "DATABASE_URL is not set: a worker needs the service's PostgreSQL", param_hint="env"
        )
    try:
        options = WorkerOptions.from_settings(
            settings,
            _parse_queues(queues),
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            heartbeat_seconds=heartbeat_seconds,
            poll_interval=poll_interval,
            cancel_grace_seconds=cancel_grace_seconds,
            shutdown_grace_seconds=shutdown_grace_seconds,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    raise typer.Exit(run_worker(options))


def register(app: typer.Typer) -> None:
    """Attach the worker command to the top-level app."""
    app.command("worker")(worker)
