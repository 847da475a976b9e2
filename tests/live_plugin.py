"""The shared live-service pytest plugin: real ``curvplan serve`` / ``curvplan worker``
processes for the tests that need them (registered by tests/conftest.py).

- helpers every harness uses: :func:`free_port`, :func:`service_env`, :class:`Proc` (a
  ``curvplan`` subprocess with its log), :func:`create_private_database`;
- the ``live`` fixture: one API + worker per test session on a private database, shared
  by tests/client, tests/cli and tests/report (starting processes is the slow part);
- every test that uses ``live`` is marked ``e2e``, so ``make test-fast`` (``-m "not e2e"``)
  starts no process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPORT_SECRET = "test-report-link-secret-" + uuid.uuid4().hex


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_api_key(database_url: str, project: str) -> str:
    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            key = create_key(session, project)
            session.commit()
    finally:
        engine.dispose()
    return key


def service_env(database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a service process: this database and data dir, fast polling,
    no HVP self-test (the engine tests check HVPs), nothing inherited from CURVPLAN_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")}
    env.update(
        DATABASE_URL=database_url,
        CURVPLAN_DATA_DIR=str(data_dir),
        CURVPLAN_WORKER_SELF_TEST="false",
        # One torch thread: the API, the worker and the tests share the machine's cores, and
        # two spinning intra-op threads per worker slow a loaded box down many times over.
        CURVPLAN_WORKER_THREADS="1",
        CURVPLAN_LOG_LEVEL="WARNING",
        CURVPLAN_LONG_POLL_INTERVAL_SECONDS="0.05",
        CURVPLAN_REPORT_LINK_SECRET=REPORT_SECRET,
        # Webhook tests post to receivers on this machine: loopback allowed explicitly.
        CURVPLAN_WEBHOOK_ALLOWED_HOSTS='["127.0.0.1"]',
        CURVPLAN_WEBHOOK_ALLOWED_NETWORKS='["127.0.0.0/8"]',
        CURVPLAN_WEBHOOK_BACKOFF_SECONDS="0.2",
        CURVPLAN_PUBLIC_URL="http://public.example",
        CURVPLAN_RATE_LIMITS="false",  # shared per database: see tests/conftest.py
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class Proc:
    """A ``curvplan`` subprocess with its log in a file."""

    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "curvplan.cli", *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL (no clean-up at all), then reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


def wait_healthy(url: str, proc: Proc | None = None, timeout: float = 60.0) -> None:
    """Until ``GET url/healthz`` answers 200 (RuntimeError with the log if ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        exited = proc is not None and proc.proc is not None and proc.proc.poll() is not None
        if exited or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up:\n" + (proc.tail() if proc else ""))
        time.sleep(0.1)


@dataclass
class ServerProcess:
    """One ``curvplan serve`` on a fixed port; can be killed and started again."""

    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "curvplan.cli", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not come up: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: an abrupt crash, connections reset mid-request."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass
class WorkerProcess:
    env: dict[str, str]
    log_path: Path
    queues: str = "cpu,gpu"
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "curvplan.cli",
                "worker",
                "--queues",
                self.queues,
                "--poll-interval",
                "0.1",
                "--cancel-grace-seconds",
                "0.5",
                "--shutdown-grace-seconds",
                "1",
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP the worker: jobs submitted meanwhile stay queued (no CPU spent on them)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass
class LiveService:
    """A running API + worker on the test database, and a key of a fresh project."""

    database_url: str
    data_dir: Path
    env: dict[str, str]
    server: ServerProcess
    worker: WorkerProcess
    api_key: str

    @property
    def url(self) -> str:
        return self.server.url

    def client_env(self, **extra: str) -> dict[str, str]:
        """Environment for a CLI subprocess talking to this service."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")}
        env.pop("DATABASE_URL", None)
        env.update(CURVPLAN_URL=self.url, CURVPLAN_API_KEY=self.api_key, PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def logs(self) -> str:
        return self.server.log_path.read_text()[-4000:] + self.worker.log_path.read_text()[-4000:]


def start_live_service(database_url: str, tmp: Path) -> LiveService:
    data_dir = tmp / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = service_env(database_url, data_dir)
    server = ServerProcess(env, tmp / "server.log")
    worker = WorkerProcess(env, tmp / "worker.log")
    worker.start()
    server.start()
    key = make_api_key(database_url, f"client-tests-{uuid.uuid4().hex[:8]}")
    return LiveService(database_url, data_dir, env, server, worker, key)


_shared: LiveService | None = None
_shared_db: tuple[str, str] | None = None  # (admin URL, database name)
_users = 0


def create_private_database(admin_url: str, prefix: str = "curvplan_client") -> tuple[str, str]:
    """A fresh database migrated with the real migrations: (its URL, its name).

    The live worker claims every queued job of its database, so it gets one of its own
    rather than the session's shared test database (other suites run workers there).
    """
    import secrets

    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    from curvplan_core.config import libpq_url, normalise_database_url
    from curvplan_server import migrations

    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = normalise_database_url(make_url(admin_url).set(database=name).render_as_string(False))
    try:
        migrations.upgrade(url)
    except BaseException:
        drop_database(admin_url, name)
        raise
    return url, name


@contextmanager
def private_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A migrated database of one test module alone (its worker claims every job in it),
    dropped afterwards."""
    url, name = create_private_database(admin_url, prefix)
    try:
        yield url
    finally:
        drop_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    from curvplan_core.config import libpq_url

    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def acquire(admin_url: str, tmp: Path) -> LiveService:
    """The session's shared service (started on first use; tests/client, cli, report share it)."""
    global _shared, _shared_db, _users
    if _shared is None:
        url, name = create_private_database(admin_url)
        _shared_db = (admin_url, name)
        _shared = start_live_service(url, tmp)
    _users += 1
    return _shared


def release() -> None:
    """Stop the shared service and drop its database when its last user is done."""
    global _shared, _shared_db, _users
    _users -= 1
    if _users == 0 and _shared is not None:
        _shared.server.stop()
        _shared.worker.stop()
        _shared = None
        if _shared_db is not None:
            drop_database(*_shared_db)
            _shared_db = None


# --------------------------------------------------------------------------- plugin hooks
@pytest.fixture(scope="session")
def live(pg_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """API + worker subprocesses on a private database (shared by every test that asks)."""
    yield acquire(pg_admin_url, tmp_path_factory.mktemp("live-service"))
    release()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the live service runs real processes: it is an ``e2e`` test."""
    for item in items:
        if "live" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
