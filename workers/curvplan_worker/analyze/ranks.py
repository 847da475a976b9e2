"""Several devices per job: the analyze attempt's data-parallel ranks, started like ``torchrun``.

For a job with ``resources.devices`` = W > 1 the attempt child is rank 0. When its inputs are
validated and its model is loaded (``DataParallel.before_join``), it starts ranks 1 … W−1 as
``python -m curvplan_worker.analyze.ranks`` with the environment ``torchrun`` gives
(MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port, RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE) and the task (model source, resolved local paths, options, machine settings)
as one JSON line on their stdin; one process group per attempt (docs/operations.md#several-
devices-per-job).

Failure handling, so that a lost rank fails the attempt as a *crash* (the worker re-queues the
job and it is retried whole) and no rank outlives its attempt:

* rank 0 watches its ranks; one that dies (signal, or an exit other than 0 and
  :data:`EXIT_RANK_RAISED`) makes rank 0 kill the others and exit with
  ``EXIT_RANK_DIED`` without a result;
* a collective that fails (a peer died or stopped answering within the process-group timeout,
  which is below the lease) does the same, on any rank;
* each rank holds the read end of its stdin pipe, whose write end only rank 0 holds: when rank
  0 ends, even by SIGKILL, the rank reads EOF and exits at once (the attempt child's lifeline);
* a rank that raises an exception exits with :data:`EXIT_RANK_RAISED`: the inputs are the same
  on every rank, so rank 0 meets the same error and reports it as the job's error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from curvplan_worker.exit_codes import EXIT_RANK_DIED, EXIT_WORKER_GONE

if TYPE_CHECKING:
    from curvplan_worker.curvature.analyze import FanOutTask
    from curvplan_worker.curvature.measured import JsonObject

    class RankTask(FanOutTask):
        """What every rank runs (JSON on its stdin): the model source, the resolved local
        paths, the options and machine settings, and a block fan-out's part."""

        spec: JsonObject
        checkpoint: str | list[str]
        data: str
        options: JsonObject
        machine: JsonObject


log = logging.getLogger("curvplan.worker.ranks")

#: A rank's exit code after an exception in the analysis (rank 0 reports the error itself).
EXIT_RANK_RAISED = 3
#: The descriptor a rank writes one byte to when it is about to join the process group.
READY_FD_ENV = "CURVPLAN_RANK_READY_FD"
TIMEOUT_ENV = "CURVPLAN_RANK_TIMEOUT_SECONDS"


def group_timeout(lease_seconds: float) -> float:
    """Seconds a collective may wait: half the worker's lease (at least 5 s).

    Below the lease, so a hung group fails the attempt while the worker still holds the job.
    """
    return max(5.0, 0.5 * lease_seconds)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (the rendezvous of rank 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class RankGroup:
    """Ranks 1 … W−1 of one attempt, seen from rank 0: start, watch, end."""

    def __init__(self, world_size: int, task: RankTask, port: int, timeout_s: float):
        self.world_size = world_size
        self.task = task
        self.port = port
        self.timeout_s = timeout_s
        self.processes: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def environment(self, rank: int) -> dict[str, str]:
        """What ``torchrun`` sets for a rank on one node (plus the group timeout)."""
        return {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port),
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(self.world_size),
            TIMEOUT_ENV: str(self.timeout_s),
        }

    def start(self) -> None:
        """Start the ranks, wait until each is about to join the group, then watch them.

        A rank that cannot be started (no memory to fork, say) is a crash like a lost one.
        """
        ready: list[int] = []
        try:
            self._spawn(ready)
        except Exception as exc:
            for fd in ready:
                os.close(fd)
            self.die(f"starting the ranks failed ({type(exc).__name__}: {exc})")
        try:
            for rank, fd in enumerate(ready, start=1):
                # EOF without the byte: the rank died while loading
                if os.read(fd, 1) != b"r":
                    self.die(
                        f"rank {rank} {_describe(self.processes[rank - 1].wait())} "
                        "before joining the process group"
                    )
        finally:
            for fd in ready:
                os.close(fd)
        threading.Thread(target=self._watch, name="rank-watch", daemon=True).start()

    def _spawn(self, ready: list[int]) -> None:
        for rank in range(1, self.world_size):
            read_fd, write_fd = os.pipe()
            ready.append(read_fd)
            env = {**os.environ, **self.environment(rank), READY_FD_ENV: str(write_fd)}
            process = subprocess.Popen(
                [sys.executable, "-m", "curvplan_worker.analyze.ranks"],
                stdin=subprocess.PIPE,
                env=env,
                pass_fds=(write_fd,),
            )
            os.close(write_fd)
            with self._lock:
                self.processes.append(process)
            assert process.stdin is not None
            process.stdin.write(json.dumps(self.task).encode() + b"\n")
            process.stdin.flush()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            for rank, process in enumerate(self.processes, start=1):
                code = process.poll()
                if code is None or code == 0:
                    continue
                if code == EXIT_RANK_RAISED:
                    continue  # rank 0 meets the same error (the group fails if it does not)
                if not self._stop.is_set():
                    self.die(f"rank {rank} of {self.world_size} {_describe(code)}")

    def kill(self) -> None:
        """SIGKILL every rank still running and reap it."""
        with self._lock:
            processes = list(self.processes)
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()

    def die(self, detail: str) -> NoReturn:
        """A rank is lost: end every rank, then end this attempt without a result (a crash)."""
        self._stop.set()
        log.error("data-parallel rank lost, the attempt fails: %s", detail)
        self.kill()
        sys.stderr.flush()
        os._exit(EXIT_RANK_DIED)

    def close(self, wait_s: float) -> None:
        """Stop watching; give the ranks ``wait_s`` seconds to exit on their own, then end them."""
        self._stop.set()
        deadline = time.monotonic() + wait_s
        with self._lock:
            processes = list(self.processes)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        self.kill()


@contextlib.contextmanager
def rank_zero(world_size: int, task: RankTask, timeout_s: float) -> Iterator[Any]:
    """Rank 0's ``DataParallel`` for ``analyze``; the other ranks start when it joins.

    On leaving, the process group is destroyed and every rank has exited (the ranks finish their
    share with the operator stages; after an error they are killed at once).
    """
    from curvplan_worker.curvature.distributed import DataParallel

    group = RankGroup(world_size, task, free_port(), timeout_s)
    os.environ.update(group.environment(0))  # this process is rank 0 of the attempt
    dp = DataParallel(
        0, world_size, 0, timeout_s=timeout_s, before_join=group.start, on_lost=group.die
    )
    ok = False
    try:
        yield dp
        ok = True
    finally:
        group._stop.set()  # from here on a rank's exit is expected
        if not ok:
            group.kill()  # before leaving the group: they may be waiting in a collective
        dp.close()
        group.close(wait_s=timeout_s if ok else 0.0)


def _watch_rank_zero() -> None:
    try:
        while sys.stdin.buffer.read(65536):
            pass
    finally:
        os._exit(EXIT_WORKER_GONE)


def main() -> NoReturn:
    """Entry of ranks 1 … W−1 (``python -m curvplan_worker.analyze.ranks``); exits 0 after its
    share of the operator stages."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0's worker owns shutdown
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    line = sys.stdin.buffer.readline()
    if not line:
        os._exit(EXIT_WORKER_GONE)
    task: RankTask = json.loads(line)
    threading.Thread(target=_watch_rank_zero, name="lifeline", daemon=True).start()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ready_fd = int(os.environ[READY_FD_ENV])

    from curvplan.types.options import MachineSettings
    from curvplan_worker.curvature.analyze import analyze, fan_out_from_task
    from curvplan_worker.curvature.distributed import DataParallel

    def lost(detail: str) -> NoReturn:
        print(f"curvplan rank {rank}: {detail}", file=sys.stderr, flush=True)
        os._exit(EXIT_RANK_DIED)

    def joining() -> None:
        os.write(ready_fd, b"r")
        os.close(ready_fd)

    dp = DataParallel(
        rank,
        world,
        int(os.environ["LOCAL_RANK"]),
        timeout_s=float(os.environ[TIMEOUT_ENV]),
        before_join=joining,
        on_lost=lost,
    )
    machine = MachineSettings.model_validate({**task["machine"], "self_test": False})
    fan_out = fan_out_from_task(task)
    try:
        analyze(
            task["spec"],
            task["checkpoint"],
            task["data"],
            task["options"],
            machine=machine,
            distributed=dp,
            only=fan_out.only,  # a block fan-out's child or fan-in: rank 0's stages
            measured=fan_out.measured,
        )
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(EXIT_RANK_RAISED)
    dp.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: the lifeline thread is blocked reading stdin, which a normal interpreter
    # shutdown would wait on
    os._exit(0)


if __name__ == "__main__":
    main()
