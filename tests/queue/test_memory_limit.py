"""The worker's memory limit (docs/operations.md#memory-limit): where it comes from, how the
supervisor tells a kernel out-of-memory kill from its own kills and from someone else's, and
the one retry at half the micro-batch before ``out-of-memory``.

The supervisor tests run a real ``WorkerSlot`` against the queue database, with attempt
children started by ``fork`` (so the test-only kind registered here is visible to them) that
really allocate memory.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from memory_test_kinds import MemoryRequest, MemoryResult
from queue_helpers import attempt_rows, job_row, wait_for
from sqlalchemy import Engine, text

from curvplan_core.jobs import lifecycle
from curvplan_worker import memstats
from curvplan_worker.attempt import classify_kill
from curvplan_worker.claim_loop import WorkerSlot
from curvplan_worker.kinds import KINDS, KindSpec
from curvplan_worker.options import WorkerOptions

FORK = multiprocessing.get_context("fork")
MiB = 2**20


# --------------------------------------------------------------------------- the limit
def test_the_environment_wins_and_names_a_bad_value() -> None:
    limit = memstats.worker_memory_limit({memstats.MEMORY_LIMIT_ENV: "24GiB"})
    assert limit == memstats.MemoryLimit(24 * 2**30, memstats.MEMORY_LIMIT_ENV)
    assert memstats.worker_memory_limit({memstats.MEMORY_LIMIT_ENV: "1000000"}).bytes == 10**6
    with pytest.raises(ValueError, match=memstats.MEMORY_LIMIT_ENV):
        memstats.worker_memory_limit({memstats.MEMORY_LIMIT_ENV: "lots"})


def test_without_a_setting_the_limit_is_the_cgroups_or_what_is_available(tmp_path) -> None:
    limit = memstats.worker_memory_limit({}, root=tmp_path)  # no cgroup files under tmp_path
    assert limit is not None and limit.source == "MemAvailable"
    assert abs(limit.bytes - memstats.mem_available()) < 2**30  # it moves a little meanwhile


def test_the_tightest_cgroup_limit_of_this_process_is_found(tmp_path) -> None:
    """A fake cgroup file system laid out like the real one for this process's groups."""
    groups = memstats._memory_cgroups(Path("/proc/self/cgroup"))
    if not groups:
        pytest.skip("this process is in no memory cgroup")
    version, path = groups[0]
    base = tmp_path / "memory" if version == "v1" else tmp_path
    if version == "v2":
        (tmp_path / "cgroup.controllers").write_text("memory\n")
    inner = base / path.lstrip("/")
    inner.mkdir(parents=True, exist_ok=True)
    name = "memory.limit_in_bytes" if version == "v1" else "memory.max"
    (inner / name).write_text(str(3 * 2**30))
    (base / name).write_text("9223372036854771712" if version == "v1" else "max")
    limit = memstats.cgroup_memory_limit("self", root=tmp_path)
    if path == "/":
        assert limit is not None and limit.bytes == 3 * 2**30
    else:
        assert limit == memstats.MemoryLimit(3 * 2**30, f"cgroup {version} {inner / name}")
        assert memstats.worker_memory_limit({}, root=tmp_path) == limit
    assert limit.per_slot(2).bytes == 3 * 2**30 // 2


def test_oom_kill_counters_are_read_from_v1_and_v2_files(tmp_path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert memstats.oom_kill_count(tmp_path) == 2
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    assert memstats.oom_kill_count(v1) == 7
    assert memstats.oom_kill_count(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("exitcode", "kills", "kind"),
    [
        (-signal.SIGKILL, 1, "kernel-oom"),
        (-signal.SIGKILL, 0, "external-kill"),
        (-signal.SIGKILL, None, "suspected-oom"),
        (-signal.SIGSEGV, 1, None),
        (3, None, None),
    ],
)
def test_only_a_sigkill_is_an_oom_and_the_counter_decides(exitcode, kills, kind) -> None:
    assert classify_kill(exitcode, kills) == kind


# --------------------------------------------------------------------------- the supervisor
@pytest.fixture(autouse=True)
def memory_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        KINDS,
        "memtest",
        KindSpec(
            name="memtest",
            queue="cpu",
            module="memory_test_kinds",
            request_type=MemoryRequest,
            result_type=MemoryResult,
        ),
    )


def _slot(db_url: str, tmp_path: Path, **options: Any) -> WorkerSlot:
    opts = WorkerOptions(
        database_url=db_url,
        queues=("cpu",),
        data_dir=tmp_path,
        lease_seconds=30.0,
        heartbeat_seconds=5.0,
        backoff_base=0.1,
        backoff_max=0.2,
        log_format="json",
        log_level="WARNING",
        **options,
    )
    engine = _engine(db_url)
    return WorkerSlot(opts, engine, FORK, threading.Event(), threading.Event(), "w-mem")


_ENGINES: list[Engine] = []


def _engine(url: str) -> Engine:
    from sqlalchemy import create_engine

    engine = create_engine(url, pool_size=2, max_overflow=2)
    _ENGINES.append(engine)
    return engine


@pytest.fixture(autouse=True)
def _dispose() -> Any:
    yield
    while _ENGINES:
        _ENGINES.pop().dispose()


def _run_job(db: Engine, slot: WorkerSlot, project_id: uuid.UUID, request: dict, attempts=3):
    job_id = uuid.uuid4()
    with db.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO job (id, project_id, kind, queue, status, request, max_attempts)"
                " VALUES (:id, :p, 'memtest', 'cpu', 'queued', CAST(:r AS jsonb), :m)"
            ),
            {"id": job_id, "p": project_id, "r": __import__("json").dumps(request), "m": attempts},
        )
        claimed = lifecycle.claim(conn, slot.worker_id, ["cpu"], 30.0)
    assert claimed is not None and claimed.fence.job_id == job_id
    slot.supervisor.run(claimed)
    return job_id


def _own_rss(queue: Any) -> None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            queue.put(int(line.split()[1]) * 1024)
            return
    queue.put(0)


def _baseline() -> int:
    """What a forked child holds before it allocates, measured in a forked child: the parent's
    own figure counts file-backed pages a child has not touched, and its tree holds the
    services other tests of the session started."""
    queue = FORK.SimpleQueue()
    child = FORK.Process(target=_own_rss, args=(queue,))
    child.start()
    rss = int(queue.get())
    child.join()
    assert rss > 0, "no VmRSS in /proc/self/status"
    return rss


def test_a_child_over_the_limit_is_stopped_and_retried_once_at_half_the_micro_batch(
    db, project_id, queue_db_url, tmp_path
) -> None:
    limit = _baseline() + 300 * MiB
    slot = _slot(queue_db_url, tmp_path, memory_limit_bytes=limit, memory_limit_source="test")
    job_id = _run_job(db, slot, project_id, {"bytes": 500 * MiB, "hold_seconds": 0.5})
    row = job_row(db, job_id)
    assert row.status == "succeeded", row.error
    # The retry (same attempt, a second process) ran at half: 250 MiB fit under the limit.
    assert row.result["factor"] == 0.5 and row.result["held_bytes"] >= 250 * MiB
    assert len(list(tmp_path.glob("pid-1-*"))) == 2
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["succeeded"]


def test_a_child_still_over_the_limit_at_half_fails_out_of_memory_without_more_attempts(
    db, project_id, queue_db_url, tmp_path
) -> None:
    limit = _baseline() + 200 * MiB
    slot = _slot(queue_db_url, tmp_path, memory_limit_bytes=limit, memory_limit_source="test")
    job_id = _run_job(db, slot, project_id, {"bytes": 900 * MiB, "hold_seconds": 5})
    row = job_row(db, job_id)
    assert row.status == "failed"
    assert row.error["type"] == "out-of-memory"
    detail = row.error["detail"]
    assert "over the worker's memory limit" in detail and "0.5 × the micro-batch" in detail
    assert "eval_batch_size" in detail  # it names what shrinks the job
    assert [a.outcome for a in attempt_rows(db, job_id)] == ["failed"]  # not re-queued


def test_a_sigkill_the_worker_did_not_send_is_an_external_kill(
    db, project_id, queue_db_url, tmp_path
) -> None:
    """The test kills the child itself: the cgroup counted no OOM kill, so it is a crash like
    any other (re-queued while attempts remain), not an out-of-memory end."""
    watch = memstats.OomWatch()
    watch.see("self")
    if not watch.available:
        pytest.skip("no cgroup here reports its OOM kills: a foreign SIGKILL reads as OOM")
    slot = _slot(queue_db_url, tmp_path)

    def kill_child() -> None:
        pid_file = wait_for(lambda: list(tmp_path.glob("pid-*")), 30, "the child to start")[0]
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    threading.Thread(target=kill_child, daemon=True).start()
    job_id = _run_job(db, slot, project_id, {"bytes": 0, "hold_seconds": 30}, attempts=1)
    row = job_row(db, job_id)
    assert row.status == "failed" and row.error["type"] == "worker-crashed"
    assert "SIGKILL from outside the worker" in row.error["detail"]
    assert "not the out-of-memory killer" in row.error["detail"]
    assert len(list(tmp_path.glob("pid-*"))) == 1  # not run again in the attempt


@pytest.fixture
def small_cgroup() -> Any:
    """A cgroup v1 memory group of 128 MiB (no swap) the test may create, or a skip."""
    parent = Path("/sys/fs/cgroup/memory")
    group = parent / f"curvplan-test-{secrets.token_hex(3)}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup here ({exc})")
    try:
        (group / "memory.limit_in_bytes").write_text(str(128 * MiB))
        swap = group / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(128 * MiB))
        yield group
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_the_kernels_oom_kill_is_recognised_and_not_retried_as_is(
    db, project_id, queue_db_url, tmp_path, small_cgroup
) -> None:
    """A real kernel out-of-memory kill: the child moves into a 128 MiB cgroup and allocates
    1 GiB (512 MiB in the retry at half): the kernel kills it twice, and the supervisor, which
    read the group's oom_kill counter before, says so."""
    slot = _slot(queue_db_url, tmp_path, memory_poll_seconds=0.1)
    request = {"bytes": 1024 * MiB, "cgroup": str(small_cgroup), "hold_seconds": 1}
    job_id = _run_job(db, slot, project_id, request)
    row = job_row(db, job_id)
    assert row.status == "failed" and row.error["type"] == "out-of-memory", row.error
    assert "kernel's out-of-memory killer" in row.error["detail"]
    assert len(list(tmp_path.glob("pid-1-*"))) == 2  # once as is, once at half
    assert memstats.oom_kill_count(small_cgroup) == 2
