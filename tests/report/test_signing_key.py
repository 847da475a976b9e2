"""The report-link key: created atomically by concurrent starters, never empty."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from curvplan_core.config import Settings
from curvplan_server.reports import signing


def _starter(data_dir: str, barrier: Any, out: Any) -> None:
    barrier.wait()
    try:
        key = signing.link_secret(Settings(data_dir=Path(data_dir)))
        out.put(key)
    except Exception as exc:  # reported to the test, which fails on it
        out.put(repr(exc).encode())


def test_concurrent_starters_agree_on_one_nonempty_key(tmp_path: Path) -> None:
    """Processes starting together on a fresh data dir all read the same, non-empty key."""
    ctx = multiprocessing.get_context("fork")
    processes_per_round, rounds = 6, 6
    for round_ in range(rounds):
        data_dir = tmp_path / f"round-{round_}"
        barrier, out = ctx.Barrier(processes_per_round), ctx.Queue()
        procs = [
            ctx.Process(target=_starter, args=(str(data_dir), barrier, out))
            for _ in range(processes_per_round)
        ]
        for p in procs:
            p.start()
        keys = [out.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        assert all(len(k) == 64 for k in keys), keys
        assert len(set(keys)) == 1, keys
        assert (data_dir / "report-link-secret").read_bytes().strip() == keys[0]
        assert (data_dir / "report-link-secret").stat().st_mode & 0o077 == 0


def test_an_empty_key_is_refused(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="report_link_secret"):
        Settings(data_dir=tmp_path, report_link_secret="")
    (tmp_path / "report-link-secret").write_bytes(b"\n")
    with pytest.raises(RuntimeError, match="empty"):
        signing.link_secret(Settings(data_dir=tmp_path))
