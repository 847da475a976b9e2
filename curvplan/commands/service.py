"""Service commands: ``serve``, ``db upgrade|downgrade|current``, ``keys create``, ``dev``, ``gc``.

Nothing here imports torch; heavy modules are imported inside the commands.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import typer

from curvplan.commands import command_group

db_app = command_group(help="Database schema (Alembic migrations).", no_args_is_help=True)
keys_app = command_group(help="API keys.", no_args_is_help=True)


def _settings():
    from curvplan_core.config import Settings

    return Settings()


def _require_database_url() -> str:
    settings = _settings()
    if settings.database_url is None:
        typer.echo(
            "error: DATABASE_URL is not set (e.g. postgresql://postgres@127.0.0.1:5432/curvplan); "
            "`curvplan dev` starts an embedded PostgreSQL instead",
            err=True,
        )
        raise typer.Exit(2)
    return settings.database_url


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    workers: int = typer.Option(1, "--workers", min=1, help="uvicorn worker processes."),
) -> None:
    """Serve the HTTP API with uvicorn (needs DATABASE_URL)."""
    from curvplan_core.logging import configure_logging

    _require_database_url()
    settings = _settings()
    configure_logging(settings.log_format, settings.log_level)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    metrics_dir = _multiprocess_metrics_dir() if workers > 1 else None
    try:
        _serve(host, port, workers, settings.access_log)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _multiprocess_metrics_dir() -> Path | None:
    """Metrics that add up over ``--workers N``: prometheus_client's multiprocess mode.

    Each uvicorn process writes its counters under ``PROMETHEUS_MULTIPROC_DIR`` and a
    scrape sums them. The directory must be empty at start: an operator-set one is
    emptied, else a fresh temporary one is made (and removed at exit, returned here).
    """
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
        return None
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="curvplan-metrics-"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    return path


def _serve(host: str, port: int, workers: int, access_log: bool) -> None:
    import uvicorn

    settings = _settings()

    uvicorn.run(
        "curvplan_server.main:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,
        access_log=access_log,
        # X-Forwarded-* only from the proxies the operator names (none by default).
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=",".join(settings.forwarded_allow_ips) or "",
    )


@db_app.command("upgrade")
def db_upgrade(
    revision: str = typer.Argument("head", help="Target revision."),
) -> None:
    """Apply the migrations shipped with curvplan up to REVISION (default: head)."""
    from curvplan_server import migrations

    url = _require_database_url()
    migrations.upgrade(url, revision)
    typer.echo(f"database at {revision}")


@db_app.command("downgrade")
def db_downgrade(revision: str = typer.Argument(..., help="Target revision, e.g. base.")) -> None:
    """Revert the migrations down to REVISION."""
    from curvplan_server import migrations

    migrations.downgrade(_require_database_url(), revision)
    typer.echo(f"database at {revision}")


@db_app.command("current")
def db_current() -> None:
    """Print the database's revision and the shipped head."""
    from curvplan_core.db import make_engine
    from curvplan_server import migrations

    engine = make_engine(_require_database_url())
    with engine.connect() as conn:
        current = migrations.current_revisions(conn)
    engine.dispose()
    typer.echo(f"current: {sorted(current) or 'none'}  head: {sorted(migrations.head_revisions())}")


@keys_app.command("create")
def keys_create(
    project: str = typer.Option(..., "--project", help="Project name (created if missing)."),
    name: str | None = typer.Option(None, "--name", help="A label for the key."),
    expires_in: str | None = typer.Option(
        None, "--expires-in", help="Expire the key after this long: 30d, 12h, 90m, 2w, 45s."
    ),
) -> None:
    """Create an API key for PROJECT and print it (it is shown only this once)."""
    from datetime import UTC, datetime

    from curvplan_core.credentials.keys import create_key, parse_duration
    from curvplan_core.db import make_engine, make_sessionmaker

    project = project.strip()
    if not project:
        raise typer.BadParameter("must not be empty", param_hint="--project")
    expires_at = None
    if expires_in is not None:
        try:
            expires_at = datetime.now(UTC) + parse_duration(expires_in)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--expires-in") from None
    engine = make_engine(_require_database_url())
    with make_sessionmaker(engine)() as session:
        key = create_key(session, project, name, expires_at)
        session.commit()
    engine.dispose()
    typer.echo(key)


@keys_app.command("create-operator")
def keys_create_operator(
    scope: list[str] = typer.Option(
        ..., "--scope", help="metrics:read (GET /metrics), workers:read (GET /v1/workers)."
    ),
    name: str | None = typer.Option(None, "--name", help="A label, e.g. prometheus."),
) -> None:
    """Create an operator key (no project, the given scopes) and print it once."""
    import curvplan_server.models  # noqa: F401  (every table: service_credential.worker_id → worker)
    from curvplan_core.credentials.service_keys import SCOPES, create_service_key
    from curvplan_core.db import make_engine, make_sessionmaker

    unknown = sorted(set(scope) - set(SCOPES))
    if unknown:
        raise typer.BadParameter(
            f"unknown {unknown}; one of {sorted(SCOPES)}", param_hint="--scope"
        )
    engine = make_engine(_require_database_url())
    with make_sessionmaker(engine)() as session:
        key = create_service_key(session, scope, name)
        session.commit()
    engine.dispose()
    typer.echo(key)


@keys_app.command("list")
def keys_list(
    project: str = typer.Option(..., "--project", help="Project name."),
) -> None:
    """List the keys of PROJECT: id, prefix, created, revoked, expires, label (never the key)."""
    from sqlalchemy import select

    from curvplan_core.credentials.models import ApiKey, Project
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(_require_database_url())
    with make_sessionmaker(engine)() as session:
        rows = session.execute(
            select(ApiKey)
            .join(Project, Project.id == ApiKey.project_id)
            .where(Project.name == project)
            .order_by(ApiKey.created_at)
        ).scalars()
        for key in rows:
            revoked = key.revoked_at.isoformat() if key.revoked_at else "-"
            expires = key.expires_at.isoformat() if key.expires_at else "never"
            typer.echo(
                f"{key.id}  {key.prefix}…  {key.created_at.isoformat()}  revoked={revoked}  "
                f"expires={expires}  {key.name or ''}".rstrip()
            )
    engine.dispose()


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(..., help="Key id (from `keys list`).")) -> None:
    """Revoke a key; API processes stop accepting it within CURVPLAN_AUTH_CACHE_SECONDS."""
    import uuid

    from sqlalchemy import func, update

    from curvplan_core.credentials.models import ApiKey
    from curvplan_core.db import make_engine

    try:
        parsed = uuid.UUID(key_id)
    except ValueError:
        raise typer.BadParameter("not a key id (a UUID from `keys list`)") from None
    engine = make_engine(_require_database_url())
    with engine.begin() as conn:
        result = conn.execute(
            update(ApiKey)
            .where(ApiKey.id == parsed, ApiKey.revoked_at.is_(None))
            .values(revoked_at=func.now())
        )
    engine.dispose()
    if result.rowcount == 0:
        typer.echo(f"error: no active key with id {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {key_id}")


def dev(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    worker: bool = typer.Option(True, "--worker/--no-worker", help="Start one worker process."),
) -> None:
    """Run everything locally: PostgreSQL (embedded unless DATABASE_URL is set), migrations,
    a development API key for project `dev`, one worker (queues cpu,gpu) and the API."""
    from curvplan_core.config import Settings
    from curvplan_core.logging import configure_logging

    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    # uvicorn re-raises the signal that stopped it once it has shut down; turn SIGTERM
    # into SystemExit so the clean-up below still runs (Ctrl-C gives KeyboardInterrupt).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    if not settings.artifact_uri_roots:
        # file:// artifacts are refused unless roots are configured; locally, one directory
        # under the data dir (the API and the worker child read it from the environment).
        files = (settings.data_dir / "files").resolve()
        files.mkdir(parents=True, exist_ok=True)
        os.environ["CURVPLAN_ARTIFACT_URI_ROOTS"] = json.dumps([str(files)])
        typer.echo(f"file:// artifacts: put them under {files}")
    embedded = None
    if settings.database_url is None:
        from curvplan_server.embedded_pg import start_embedded_postgres

        typer.echo(f"starting embedded PostgreSQL under {settings.data_dir / 'pg'} …")
        embedded, url = start_embedded_postgres(settings.data_dir)
        os.environ["DATABASE_URL"] = url
    else:
        url = settings.database_url
    try:
        _run_dev(url, settings.data_dir, host, port, worker)
    finally:
        if embedded is not None:
            typer.echo("stopping embedded PostgreSQL …")
            embedded.cleanup()


def _exit_on_signal(signum: int, frame: object) -> None:
    """SIGTERM after uvicorn's graceful shutdown: a requested stop, so exit status 0."""
    raise SystemExit(0)


def _worker_command() -> list[str]:
    script = Path(sys.executable).with_name("curvplan")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from curvplan.cli import main; main()"]


def _run_dev(url: str, data_dir: Path, host: str, port: int, worker: bool) -> None:
    """Migrate, print the dev key, start the worker, serve until stopped."""
    import uvicorn

    from curvplan_server import migrations

    migrations.upgrade(url)
    key = _dev_key(url, data_dir)
    typer.echo(
        f"\n  curvplan API   http://{host}:{port}   (docs: http://{host}:{port}/docs)\n"
        f"  project dev    API key: {key}\n"
        f"  try: curl -H 'Authorization: Bearer {key}' http://{host}:{port}/v1/jobs\n"
    )
    child: subprocess.Popen[bytes] | None = None
    if worker:
        child = subprocess.Popen(
            [*_worker_command(), "worker", "--queues", "cpu,gpu"],
            # The worker shares the data dir: a client's CURVPLAN_URL in the shell (perhaps
            # another service) must not turn it into a worker of another host.
            env={
                **{k: v for k, v in os.environ.items() if k != "CURVPLAN_URL"},
                "DATABASE_URL": url,
            },
        )
    try:
        uvicorn.run(
            "curvplan_server.main:create_app",
            factory=True,
            host=host,
            port=port,
            log_config=None,
            proxy_headers=False,  # no proxy in front of a development server
        )
    finally:
        if child is not None:
            _stop_child(child)


def _dev_key(url: str, data_dir: Path) -> str:
    """Reuse the development key stored in the data dir while it is valid, else make one."""
    from curvplan_core.credentials.keys import create_key, lookup_key
    from curvplan_core.db import make_engine, make_sessionmaker

    key_file = data_dir / "dev-api-key"
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as session:
            if key_file.exists():
                key = key_file.read_text().strip()
                ctx = lookup_key(session, key)
                if ctx is not None and ctx.project_name == "dev":
                    return key
            key = create_key(session, "dev", "development key (curvplan dev)")
            session.commit()
    finally:
        engine.dispose()
    data_dir.mkdir(parents=True, exist_ok=True)
    # Created 0600 from the start: the key must never be readable by others, even briefly.
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    key_file.chmod(0o600)  # O_CREAT's mode does not apply to a file that already existed
    return key


def _stop_child(child: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the worker (it finishes or releases its job), then kill it after ``grace``."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def gc(
    older_than_days: float | None = typer.Option(
        None,
        "--older-than-days",
        min=0,
        help="Delete finished jobs older than this (default: CURVPLAN_JOB_RETENTION_DAYS; "
        "unset: keep jobs, collect only temp files and unreferenced blobs).",
    ),
) -> None:
    """One storage clean-up pass; prints a JSON summary (docs/storage.md).

    Stale upload temp files, finished jobs past retention (never the latest succeeded job of
    a name; a parent with its children), then blobs no artifact references. Safe while the
    API and workers run.
    """
    import json

    from curvplan_core.artifacts.blobstore import default_store
    from curvplan_core.db import make_engine
    from curvplan_core.storage.gc import run_gc

    url = _require_database_url()
    settings = _settings()
    engine = make_engine(url, pool_size=1, max_overflow=1)
    try:
        summary = run_gc(
            engine,
            default_store(settings.data_dir),
            retention_days=(
                older_than_days if older_than_days is not None else settings.job_retention_days
            ),
            blob_grace_seconds=settings.blob_gc_grace_seconds,
            temp_max_age_seconds=settings.temp_file_max_age_seconds,
        )
    finally:
        engine.dispose()
    typer.echo(json.dumps(summary, indent=2))


def register(app: typer.Typer) -> None:
    """Attach the service commands to the top-level app."""
    app.command("serve")(serve)
    app.command("gc")(gc)
    app.command("dev")(dev)
    app.add_typer(db_app, name="db")
    app.add_typer(keys_app, name="keys")
