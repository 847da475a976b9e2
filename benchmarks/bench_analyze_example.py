"""How long the ``curvplan example`` model takes to analyse through the API (goal:
under two minutes on the development machine, CPU only).

Runs ``curvplan example --out DIR``, starts ``curvplan serve`` and ``curvplan worker --queues
gpu,cpu`` on a fresh database, uploads the checkpoint and the data, POSTs an analyze job with
default options (only ``--options`` JSON overrides), long-polls it, and prints the wall time of
each phase and of every progress stage the job reported.

    DATABASE_ADMIN_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        python benchmarks/bench_analyze_example.py [--options '{"precision": "float64"}']
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "analyze"))
sys.path.insert(0, str(ROOT / "tests"))  # live.py uses the shared live-service plugin

from live import start_service  # noqa: E402

from curvplan_core.config import libpq_url, normalise_database_url  # noqa: E402
from curvplan_server import migrations  # noqa: E402


def main() -> None:
    # SIGTERM (e.g. `timeout`) unwinds through the finally blocks: processes and DB cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", default="{}", help="analyze options (JSON)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    name = f"curvplan_bench_{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(admin), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = normalise_database_url(make_url(admin).set(database=name).render_as_string(False))
    tmp = Path(tempfile.mkdtemp(prefix="curvplan-bench-"))
    try:
        migrations.upgrade(url)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "curvplan.cli", "example", "--out", str(tmp / "example")],
            check=True,
            capture_output=True,
        )
        t_example = time.perf_counter() - t0
        _run(url, tmp, json.loads(args.options), args.timeout, t_example)
    finally:
        with psycopg.connect(libpq_url(admin), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _key(url: str) -> str:
    from curvplan_core.credentials.keys import create_key
    from curvplan_core.db import make_engine, make_sessionmaker

    engine = make_engine(url)
    with make_sessionmaker(engine)() as session:
        key = create_key(session, "bench")
        session.commit()
    engine.dispose()
    return key


def _run(url: str, tmp: Path, options: dict, timeout: float, t_example: float) -> None:
    t0 = time.perf_counter()
    service = start_service(url, tmp, CURVPLAN_MAX_ARTIFACT_BYTES=str(1 << 30))
    t_start = time.perf_counter() - t0
    try:
        key = _key(url)
        client = httpx.Client(
            base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        example = tmp / "example"
        spec = json.loads((example / "spec.json").read_text())
        t0 = time.perf_counter()
        ids = {}
        for kind, file in (
            ("checkpoint", "checkpoint.safetensors"),
            ("dataset", "data.safetensors"),
        ):
            with (example / file).open("rb") as fh:
                response = client.post(
                    "/v1/artifacts", files={"file": (file, fh)}, data={"kind": kind}
                )
            response.raise_for_status()
            ids[kind] = response.json()["id"]
        t_upload = time.perf_counter() - t0
        print(
            f"example {t_example:.1f} s, start {t_start:.1f} s, upload {t_upload:.1f} s", flush=True
        )
        print("stages (seconds since POST, first seen by polling):", flush=True)
        body = {"kind": "analyze", "name": "example", "model": spec, **ids, "options": options}
        t0 = time.perf_counter()
        job = client.post("/v1/jobs", json=body).json()
        stages: list[tuple[float, str]] = []
        while True:
            current = client.get(f"/v1/jobs/{job['id']}", params={"wait": 1}).json()
            stage = (current.get("progress") or {}).get("stage") or current["status"]
            if not stages or stages[-1][1] != stage:
                stages.append((time.perf_counter() - t0, stage))
                print(f"  {stages[-1][0]:7.1f}  {stage}", flush=True)
            if current["status"] in ("succeeded", "failed", "cancelled"):
                break
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"timed out; last stage {stage}")
        t_job = time.perf_counter() - t0
        print(f"curvplan example (train + write):   {t_example:7.1f} s")
        print(f"serve + worker start:               {t_start:7.1f} s")
        print(f"upload checkpoint + data:           {t_upload:7.1f} s")
        print(f"analyze job, POST → {current['status']}:      {t_job:7.1f} s")
        print(f"end to end (upload + job):          {t_upload + t_job:7.1f} s")
        if current["result"]:
            print(f"n_parameters={current['result']['measurements']['n_parameters']}")
        if current["status"] != "succeeded":
            print("error:", current["error"])
    finally:
        service.server.stop()
        service.worker.stop()


if __name__ == "__main__":
    main()
