"""``curvplan serve --workers 2``: every scrape of /metrics shows the sum of both processes.

Without prometheus_client's multiprocess mode each scrape lands on one process and shows
only its own counters, so a counter jumps between two values and ``rate()`` is wrong.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

from live_plugin import free_port  # noqa: E402

HEALTHZ = re.compile(
    r'^curvplan_http_requests_total\{method="GET",route="/healthz",status="200"\} (\S+)$', re.M
)


def operator_key(database_url: str) -> str:
    from curvplan_core.credentials.service_keys import create_service_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            key = create_service_key(session, ["metrics:read"], f"test-{uuid.uuid4().hex[:6]}")
            session.commit()
    finally:
        engine.dispose()
    return key


def test_two_processes_counts_sum_in_every_scrape(database_url: str, tmp_path: Path) -> None:
    port = free_port()
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if not k.startswith("CURVPLAN_")}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(
        DATABASE_URL=database_url,
        CURVPLAN_DATA_DIR=str(tmp_path / "data"),
        CURVPLAN_LOG_LEVEL="WARNING",
        CURVPLAN_ACCESS_LOG="false",
    )
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "curvplan.cli", "serve", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-2000:]
            time.sleep(0.2)
        key = operator_key(database_url)
        sent = 60
        for _ in range(sent - 1):  # one fresh connection each: both processes get some
            assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        counts = []
        for _ in range(6):
            scrape = httpx.get(
                base + "/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=5
            )
            assert scrape.status_code == 200, scrape.text
            match = HEALTHZ.search(scrape.text)
            counts.append(float(match.group(1)) if match else 0.0)
        assert counts == [float(sent)] * len(counts), counts
    finally:
        server.terminate()
        server.wait(30)
        log.close()
