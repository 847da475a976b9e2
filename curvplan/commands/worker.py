"""Worker command: ``curvplan worker --queues cpu,gpu``."""

from __future__ import annotations

from pathlib import Path

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
    device: str | None = typer.Option(
        None, "--device", help="Engine device: auto, cpu, cuda[:index] (CURVPLAN_WORKER_DEVICE)."
    ),
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="torch intra-op threads (CURVPLAN_WORKER_THREADS)."
    ),
    self_test: bool | None = typer.Option(
        None,
        "--self-test/--no-self-test",
        help="Check HVPs against finite differences before each analysis (default: on).",
    ),
    cache_graph: bool | None = typer.Option(
        None,
        "--cache-graph/--no-cache-graph",
        help="Keep the gradient graph between products (default: on; off saves memory).",
    ),
    devices: int | None = typer.Option(
        None,
        "--devices",
        min=1,
        help="Devices one job may use in data parallel (CURVPLAN_WORKER_DEVICES, default 1).",
    ),
    memory_budget: str | None = typer.Option(
        None,
        "--memory-budget",
        help="Bytes a job's curvature products may use, e.g. 8GiB (CURVPLAN_WORKER_MEMORY_BUDGET;"
        " default: free CUDA memory × 0.9; on CPU within CURVPLAN_WORKER_MEMORY_LIMIT).",
    ),
    health_file: Path | None = typer.Option(
        None,
        "--health-file",
        help="Touch this file after every heartbeat (CURVPLAN_WORKER_HEALTH_FILE).",
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=0, help="Serve this worker's /metrics and /healthz here."
    ),
    metrics_host: str | None = typer.Option(
        None, "--metrics-host", help="Interface of --metrics-port (default 127.0.0.1)."
    ),
) -> None:
    """Claim and run jobs of QUEUES until SIGTERM/SIGINT (finish or release the running job).

    The machine settings (device, threads, self-test, graph caching) are the worker's: flags
    override the CURVPLAN_WORKER_* environment, which the job processes inherit.
    """
    import os

    from curvplan_core.config import get_settings
    from curvplan_worker.options import WorkerOptions
    from curvplan_worker.worker import run_worker

    flags = {"device": device, "threads": threads, "self_test": self_test}
    flags["cache_graph"] = cache_graph
    flags["devices"] = devices
    for name, value in flags.items():
        if value is not None:  # the job processes read their settings from the environment
            os.environ[f"CURVPLAN_WORKER_{name.upper()}"] = str(value).lower()
    if lease_seconds is not None:  # a data-parallel group's timeout stays below the lease
        os.environ["CURVPLAN_LEASE_SECONDS"] = str(lease_seconds)
    if memory_budget is not None:
        os.environ["CURVPLAN_WORKER_MEMORY_BUDGET"] = memory_budget
    get_settings.cache_clear()
    try:
        settings = get_settings()
        settings.machine_settings()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
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
            health_file=health_file,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    raise typer.Exit(run_worker(options))


def worker_health(
    health_file: Path | None = typer.Option(
        None, "--file", help="The worker's health file (default: CURVPLAN_WORKER_HEALTH_FILE)."
    ),
    max_age: float = typer.Option(
        60.0, "--max-age", min=0.1, help="Healthy if a heartbeat reached the DB this recently."
    ),
) -> None:
    """Exit 0 if the worker's last heartbeat reached the database within MAX_AGE seconds.

    For container health checks: the worker touches its health file after every heartbeat
    the database accepted (a worker that lost its database, or hangs, stops touching it).
    """
    import os

    from curvplan_worker.health import health_file_age

    path = health_file or (
        Path(os.environ["CURVPLAN_WORKER_HEALTH_FILE"])
        if os.environ.get("CURVPLAN_WORKER_HEALTH_FILE")
        else None
    )
    if path is None:
        raise typer.BadParameter("give --file or set CURVPLAN_WORKER_HEALTH_FILE")
    age = health_file_age(path)
    if age is None:
        typer.echo(f"unhealthy: {path} does not exist (no heartbeat yet)", err=True)
        raise typer.Exit(1)
    if age > max_age:
        typer.echo(f"unhealthy: last heartbeat {age:.1f} s ago (> {max_age:g} s)", err=True)
        raise typer.Exit(1)
    typer.echo(f"healthy: last heartbeat {age:.1f} s ago")


def register(app: typer.Typer) -> None:
    """Attach the worker commands to the top-level app."""
    app.command("worker")(worker)
    app.command("worker-health")(worker_health)
