"""The key commands of ``curvplan`` run as a user runs them: a fresh process on a real
database (so only the modules the command imports are loaded, unlike in-process tests that
import every table), then the key they print used against the API."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

CLI = [sys.executable, "-c", "from curvplan.cli import main; main()"]


def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "CURVPLAN_LOG_FORMAT": "console"}
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_create_operator_prints_a_key_that_reaches_its_routes(
    database_url: str, client: Any
) -> None:
    """The documented Prometheus credential: ``keys create-operator --scope metrics:read``."""
    made = run_cli(database_url, "keys", "create-operator", "--scope", "metrics:read")
    assert made.returncode == 0, made.stderr
    assert "NoReferencedTableError" not in made.stderr
    key = made.stdout.strip().splitlines()[-1]
    assert key.startswith("cpo_")
    headers = {"Authorization": f"Bearer {key}"}
    assert client.get("/metrics", headers=headers).status_code == 200
    assert client.get("/v1/workers", headers=headers).status_code == 403  # not its scope
