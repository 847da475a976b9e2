"""Blob transfer of a worker on another host vs reading the API's data directory in place.

Starts ``curvplan serve`` on a fresh database with data directory A, puts one safetensors
blob of ``--mib`` MiB there (``PUT /v1/worker/blobs``, timed: what a remote worker's output
costs), then times, side by side, what an attempt pays to get a readable, verified input:

* local: the shared-directory shortcut (the file in A, validated: header only);
* remote, cold: ``ArtifactAccess`` with its own empty store B and cache — download through the
  API, sha256 verified, atomic rename, safetensors validated;
* remote, warm: the same with the blob already cached (an LRU hit: a touch and a validation).

Each figure is the median of ``--repeats`` runs; ratios are against the local read.

    python benchmarks/bench_remote_blobs.py [--mib 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg
from psycopg import sql
from sqlalchemy import text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench_api import wait_ready  # noqa: E402
from live_plugin import free_port  # noqa: E402

from curvplan_core.artifacts.blobstore import BlobStore, default_store  # noqa: E402
from curvplan_core.artifacts.safetensors_format import validate_file  # noqa: E402
from curvplan_core.config import libpq_url  # noqa: E402
from curvplan_core.credentials.service_keys import create_worker_key  # noqa: E402
from curvplan_core.db import make_engine  # noqa: E402
from curvplan_server import migrations  # noqa: E402
from curvplan_worker.analyze.artifacts import ArtifactAccess  # noqa: E402
from curvplan_worker.blobs.cache import BlobCache  # noqa: E402
from curvplan_worker.blobs.client import BlobApi  # noqa: E402


def make_blob(path: Path, mib: int) -> str:
    from safetensors.numpy import save_file

    values = np.random.default_rng(0).standard_normal(mib * 1024 * 1024 // 4).astype(np.float32)
    save_file({"weights": values}, str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(admin: str, mib: int, repeats: int) -> None:
    name = f"curvplan_rb_{secrets.token_hex(3)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin.rsplit("/", 1)[0] + "/" + name
    server = None
    tmp = Path(tempfile.mkdtemp(prefix="bench-remote-blobs-"))
    try:
        migrations.upgrade(url)
        engine = make_engine(url)
        worker_id = f"bench-{uuid.uuid4().hex[:6]}"
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO worker (id, hostname, pid, queues, status)"
                    " VALUES (:id, 'bench', 1, ARRAY['gpu'], 'running')"
                ),
                {"id": worker_id},
            )
            key = create_worker_key(conn, worker_id)
        api_dir = tmp / "api-data"
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "CURVPLAN_DATA_DIR": str(api_dir),
            "CURVPLAN_LOG_LEVEL": "WARNING",
            "CURVPLAN_ACCESS_LOG": "false",
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "curvplan.cli", "serve", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        asyncio.run(wait_ready(base))
        source = tmp / "blob.safetensors"
        digest = make_blob(source, mib)
        api = BlobApi(base, key, 120)
        upload_s = timed(lambda: api.upload(source, digest), repeats)
        local_store = default_store(api_dir)

        def local() -> None:
            validate_file(str(local_store.path_for(digest)))

        def remote(cache_dir: Path, fresh: bool) -> None:
            if fresh and cache_dir.exists():
                for path in cache_dir.glob("[0-9a-f][0-9a-f]/*"):
                    path.unlink()
            with ArtifactAccess(
                engine,
                BlobStore(tmp / "worker-data" / "blobs"),
                api=BlobApi(base, key, 120),
                cache=BlobCache(cache_dir, 4 * mib * 1024 * 1024),
            ) as access:
                path = access.blob_path(digest, "bench blob")
                validate_file(str(path))

        cache_dir = tmp / "worker-data" / "cache"
        local_s = timed(local, repeats)
        cold_s = timed(lambda: remote(cache_dir, True), repeats)
        warm_s = timed(lambda: remote(cache_dir, False), repeats)
        engine.dispose()
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    size = mib
    print(
        f"one {size} MiB safetensors blob, API on 127.0.0.1 (loopback), median of {repeats}, "
        f"cores={os.cpu_count()}, load average={os.getloadavg()[0]:.1f}"
    )
    rows = [
        ("local: the API's directory, in place", local_s),
        ("remote, cold: download+sha256+rename", cold_s),
        ("remote, warm: cache hit", warm_s),
        ("remote: upload an output (PUT)", upload_s),
    ]
    for label, seconds in rows:
        print(
            f"  {label:40s} {seconds * 1e3:9.1f} ms  {size / seconds:8.0f} MiB/s"
            f"  ×{seconds / local_s:7.1f} local"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "CURVPLAN_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    run(libpq_url(args.admin_url), args.mib, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
