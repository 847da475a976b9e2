"""curvplan installs like a library: the wheel in a fresh venv, outside this checkout.

The dependencies come from a wheelhouse built once (``pip download --require-hashes`` of the
api image's lock, requirements/server.txt) and cached under .pytest_cache, keyed by the lock;
each run builds the project's wheel and installs it with ``--no-index`` into a venv without
system site-packages. Torch is not needed: the worker serves the cpu queue.

Checked: the base install brings only the client's dependencies; a user project with its
own top-level ``app`` package imports curvplan and uses the client; with ``[server]``,
``curvplan db upgrade`` (migrations from the wheel), ``serve`` (/readyz 200) and
``worker --queues cpu`` (runs a plan job the client submitted) work.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from live_plugin import drop_database, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]
_SOURCES = {"pyproject.toml", "setup.py", "README.md", "LICENSE", "alembic", "app", "workers"}
_SOURCES |= {"curvplan"}
SERVER_ONLY = ("fastapi", "sqlalchemy", "alembic", "uvicorn", "numpy", "scipy", "torch")


def _run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{args}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """The server extra's dependencies as wheels, pinned with hashes by the lock (built once)."""
    lock = ROOT / "requirements" / "server.txt"
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    house = ROOT / ".pytest_cache" / "curvplan-wheelhouse" / key
    if not (house / ".complete").exists():
        house.mkdir(parents=True, exist_ok=True)
        _run(
            [
                *PIP,
                *("download", "-q", "--only-binary", ":all:", "-d", str(house)),
                *("--require-hashes", "-r", str(lock)),
            ]
        )
        (house / ".complete").touch()
    return house


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Path:
    """A fresh venv (no system site-packages) holding only the built curvplan wheel."""
    tmp = tmp_path_factory.mktemp("wheel-install")
    dist = tmp / "dist"
    source = tmp / "source"  # a copy: setuptools writes build/ and *.egg-info into the tree
    shutil.copytree(
        ROOT,
        source,
        ignore=lambda folder, names: (
            [n for n in names if Path(folder) == ROOT and n not in _SOURCES]
            + [n for n in names if n in ("__pycache__", "build") or n.endswith(".egg-info")]
        ),
    )
    _run([*PIP, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)])
    (wheel,) = dist.glob("curvplan-*.whl")
    shutil.copy(wheel, wheelhouse / wheel.name)  # replaced each run: the code changes
    env = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env)])
    _run(
        [
            *PIP,
            *("--python", str(env / "bin" / "python"), "install", "-q", "--no-index"),
            *("--find-links", str(wheelhouse), str(wheelhouse / wheel.name)),
        ]
    )
    return env


def _installed(env: Path) -> set[str]:
    code = (
        "import importlib.metadata as m; "
        "print('\\n'.join(d.metadata['Name'] for d in m.distributions()))"
    )
    out = _run([str(env / "bin" / "python"), "-c", code])
    return {line.strip().lower().replace("_", "-") for line in out.stdout.splitlines()}


def _user_project(tmp: Path) -> Path:
    """A project with the usual FastAPI layout: its own top-level ``app`` package."""
    project = tmp / "user-project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text("NAME = 'the user app'\n")
    (project / "app" / "artifacts.py").write_text("WHOSE = 'user'\n")
    (project / "use_client.py").write_text(
        textwrap.dedent(
            """
            import json, sys
            import app, app.artifacts
            import curvplan
            from curvplan import Client

            assert app.NAME == "the user app" and app.artifacts.WHOSE == "user"
            assert "fastapi" not in sys.modules and "sqlalchemy" not in sys.modules
            if len(sys.argv) > 1:
                url, key, measurements = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
                with Client(url, key) as api:
                    job = api.wait(api.submit_plan(measurements).id, timeout=120)
                    print(json.dumps({"status": job.status,
                                      "b_noise": api.get_recommendation(job.id)
                                      .batch_size.b_noise.value}))
            else:
                print(curvplan.__name__)
            """
        )
    )
    return project


def test_the_wheel_installs_and_runs_outside_the_checkout(
    venv: Path, wheelhouse: Path, pg_admin_url: str, tmp_path: Path
) -> None:
    python = str(venv / "bin" / "python")
    curvplan = str(venv / "bin" / "curvplan")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CURVPLAN_", "PYTHON"))}
    clean.pop("DATABASE_URL", None)
    project = _user_project(tmp_path)

    # The base install: the client's dependencies only.
    installed = _installed(venv)
    assert "curvplan" in installed and "httpx" in installed and "pydantic" in installed
    assert not installed & set(SERVER_ONLY), installed & set(SERVER_ONLY)
    out = _run([python, "use_client.py"], cwd=project, env=clean)
    assert out.stdout.strip() == "curvplan"

    # The server extra, from the same wheelhouse; migrations from the wheel, not alembic/.
    wheel = next(wheelhouse.glob("curvplan-*.whl"))
    _run(
        [
            *PIP,
            "--python",
            python,
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(wheelhouse),
            f"curvplan[server] @ {wheel.as_uri()}",
        ]
    )
    assert "torch" not in _installed(venv)
    url, name = _empty_database(pg_admin_url)  # `curvplan db upgrade` migrates it
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = {**clean, "DATABASE_URL": url, "CURVPLAN_DATA_DIR": str(tmp_path / "data")}
        _run([curvplan, "db", "upgrade"], cwd=tmp_path, env=env)
        key = _run([curvplan, "keys", "create", "--project", "wheel"], cwd=tmp_path, env=env)
        api_key = key.stdout.strip().split()[-1]
        port = free_port()
        log = (tmp_path / "procs.log").open("wb")
        for args in (["serve", "--port", str(port)], ["worker", "--queues", "cpu"]):
            procs.append(
                subprocess.Popen([curvplan, *args], cwd=tmp_path, env=env, stdout=log, stderr=log)
            )
        base = f"http://127.0.0.1:{port}"
        _wait_ready(base, procs, tmp_path / "procs.log")
        measurements = {
            "gradient_noise": {
                "grad_sq_norm": 0.02,
                "trace_sigma": 3.1,
                "gHg": 0.004,
                "trace_h_sigma": 0.9,
            }
        }
        out = _run(
            [python, "use_client.py", base, api_key, json.dumps(measurements)],
            cwd=project,
            env=clean,
        )
        answer = json.loads(out.stdout.strip().splitlines()[-1])
        assert answer["status"] == "succeeded"
        assert answer["b_noise"] == pytest.approx(0.9 / 0.004)  # B_noise = tr(HΣ)/GᵀHG
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        drop_database(pg_admin_url, name)


def _empty_database(admin_url: str) -> tuple[str, str]:
    import secrets

    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    from curvplan_core.config import libpq_url, normalise_database_url

    name = f"curvplan_wheel_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = normalise_database_url(make_url(admin_url).set(database=name).render_as_string(False))
    return url, name


def _wait_ready(base: str, procs: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("serve did not answer /readyz 200:\n" + log.read_text()[-3000:])
