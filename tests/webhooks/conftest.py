"""Fixtures of the webhook tests: a real HTTP receiver, committed rows, webhook settings, and
a database of this package alone, with no delivery left over from an earlier test.

``deliver_due`` sends every due delivery of its database, whoever queued it, oldest first and
``batch`` at a time. On the session's shared database a delivery another test left pending is
due to the next test's sender: it takes a place in its batch (on a loaded machine, the test's
own delivery may wait past its deadline), and if it points at a receiver that is gone, whose
port the OS may give this test's receiver, it is counted among this test's requests
(``test_signed_post_retried_after_500s_and_never_sent_again`` once failed on a loaded machine
when ``deliver_due`` found another test's delivery due). So these tests get a database of
their own, and each test that uses it starts with no delivery in it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import live_plugin
import pytest
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))  # plan_bodies

from receiver import Receiver, SilentReceiver, start_receiver, start_silent_receiver


@pytest.fixture(scope="module")
def database_url(pg_admin_url: str) -> Iterator[str]:
    """A migrated database of this module alone (overrides the session's shared one)."""
    with live_plugin.private_database(pg_admin_url, "curvplan_hooks") as url:
        yield url


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Any]:
    from curvplan_core.db import make_engine

    eng = make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture(autouse=True)
def _no_leftover_deliveries(request: pytest.FixtureRequest) -> None:
    """A test that uses the database starts with no delivery in it (earlier tests' pending
    ones would be due to its sender)."""
    if "engine" not in request.fixturenames and "client" not in request.fixturenames:
        return
    with request.getfixturevalue("engine").begin() as conn:
        conn.execute(text("TRUNCATE webhook_delivery, webhook_endpoint CASCADE"))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from start_receiver()


@pytest.fixture
def settings(database_url: str) -> Any:
    """API settings that allow callbacks to this machine (loopback explicitly allowed)."""
    from curvplan_core.config import Settings

    return Settings(
        database_url=database_url,
        auth_disabled=False,
        log_format="console",
        webhook_allowed_hosts=["127.0.0.1"],
        webhook_allowed_networks=["127.0.0.0/8"],
    )


@pytest.fixture
def silent_receiver() -> Iterator[SilentReceiver]:
    yield from start_silent_receiver()
