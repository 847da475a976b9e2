"""The memory of attempts: device memory (metrics), the worker's memory limit, OOM kills.

Device memory, for the worker's metrics:

Read in the attempt child (the worker parent never initialises CUDA): CUDA allocated,
reserved and peak-allocated bytes per device once this process has initialised CUDA, nothing
otherwise (the parent then reports the child's resident memory, ``metrics.rss_bytes``).
torch is not imported here: a process that never loaded it has no device memory.

The worker's memory limit (:func:`worker_memory_limit`, docs/operations.md#memory-limit) and
the kernel's out-of-memory kills (:class:`OomWatch`) are read from ``/proc`` and the cgroup
file system, so the supervisor can tell the kernel's kill from its own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path


def device_memory() -> dict[str, dict[str, int]]:
    """``{"cuda:0": {"allocated": …, "reserved": …, "peak": …}, …}`` or ``{}``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        return {
            f"cuda:{i}": {
                "allocated": int(torch.cuda.memory_allocated(i)),
                "reserved": int(torch.cuda.memory_reserved(i)),
                "peak": int(torch.cuda.max_memory_allocated(i)),
            }
            for i in range(torch.cuda.device_count())
        }
    except Exception:  # a broken driver must not fail the job's progress report
        return {}


# --------------------------------------------------------------------------- the worker's limit
MEMORY_LIMIT_ENV = "CURVPLAN_WORKER_MEMORY_LIMIT"
"""Bytes (or ``24GiB``) one job of this worker may hold in host memory, children included."""

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED_FROM = 2**60
"""A cgroup v1 ``memory.limit_in_bytes`` at or above this means no limit (the kernel writes
``PAGE_COUNTER_MAX`` pages, about 2^63)."""


@dataclass(frozen=True)
class MemoryLimit:
    """The host memory a worker's jobs may use and where that figure comes from."""

    bytes: int
    source: str

    def per_slot(self, slots: int) -> MemoryLimit:
        """This limit shared by ``slots`` jobs running at once (``--concurrency``)."""
        if slots <= 1:
            return self
        return MemoryLimit(self.bytes // slots, f"{self.source} / {slots} slots")


def _memory_cgroups(proc_cgroup: Path) -> list[tuple[str, str]]:
    """``[(version, path)]`` of the memory controller in ``/proc/<pid>/cgroup`` (v1 line
    ``N:memory:/path``, v2 line ``0::/path``)."""
    out: list[tuple[str, str]] = []
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            out.append(("v1", path))
        elif hierarchy == "0" and controllers == "":
            out.append(("v2", path))
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def cgroup_dirs(pid: int | str = "self", root: Path = CGROUP_ROOT) -> list[Path]:
    """The memory cgroup directories of ``pid`` that exist, innermost first, up to the root
    of each hierarchy (a limit set on an enclosing group applies too)."""
    dirs: list[Path] = []
    for version, path in _memory_cgroups(Path(f"/proc/{pid}/cgroup")):
        base = root / "memory" if version == "v1" else root
        if version == "v2" and not (root / "cgroup.controllers").exists():
            base = root / "unified"
        rel = Path(path.lstrip("/"))
        while True:
            candidate = base / rel
            if candidate.is_dir():
                dirs.append(candidate)
            if rel == Path("") or rel == Path("."):
                break
            rel = rel.parent
    return dirs


def cgroup_memory_limit(pid: int | str = "self", root: Path = CGROUP_ROOT) -> MemoryLimit | None:
    """The tightest memory limit of ``pid``'s cgroups: v2 ``memory.max``, v1
    ``memory.limit_in_bytes``; None when every group is unlimited (or there is none)."""
    best: MemoryLimit | None = None
    for directory in cgroup_dirs(pid, root):
        for name, version in (("memory.max", "v2"), ("memory.limit_in_bytes", "v1")):
            value = _read_int(directory / name)
            if value is None or value <= 0 or value >= UNLIMITED_FROM:
                continue
            if best is None or value < best.bytes:
                best = MemoryLimit(value, f"cgroup {version} {directory / name}")
    return best


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where there is none)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def worker_memory_limit(
    environ: dict[str, str] | None = None, root: Path = CGROUP_ROOT
) -> MemoryLimit | None:
    """The worker's memory limit: ``CURVPLAN_WORKER_MEMORY_LIMIT`` (bytes or ``24GiB``), else
    the cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``), else ``MemAvailable``
    now. ValueError naming the variable when it is set but is not a size."""
    from curvplan.types.options import parse_byte_size

    env = os.environ if environ is None else environ
    configured = env.get(MEMORY_LIMIT_ENV)
    if configured is not None and configured.strip():
        try:
            size = parse_byte_size(configured)
        except ValueError as exc:
            raise ValueError(f"{MEMORY_LIMIT_ENV}: {exc}") from None
        if size is not None:
            return MemoryLimit(size, MEMORY_LIMIT_ENV)
    limit = cgroup_memory_limit("self", root)
    if limit is not None:
        return limit
    available = mem_available()
    return MemoryLimit(available, "MemAvailable") if available else None


# --------------------------------------------------------------------------- the OOM killer
def oom_kill_count(directory: Path) -> int | None:
    """The kernel's out-of-memory kills in one cgroup: ``oom_kill`` of v2 ``memory.events`` or
    of v1 ``memory.oom_control`` (kernel ≥ 4.13); None where neither file says."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            lines = (directory / name).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                try:
                    return int(value)
                except ValueError:
                    return None
    return None


class OomWatch:
    """The ``oom_kill`` counters of a process's memory cgroups, read when it starts and again
    after it died: an increase while it ran says the kernel's out-of-memory killer acted there.

    :meth:`see` is called while the process lives (it may have moved to another group);
    :meth:`kills` after its death compares every group seen with its first count.
    """

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        self.first: dict[Path, int] = {}

    def see(self, pid: int | str) -> None:
        for directory in cgroup_dirs(pid, self.root):
            if directory not in self.first:
                count = oom_kill_count(directory)
                if count is not None:
                    self.first[directory] = count

    @property
    def available(self) -> bool:
        """Whether any group of the process reports its kills."""
        return bool(self.first)

    def kills(self) -> int:
        """Out-of-memory kills in the groups seen since they were first seen."""
        total = 0
        for directory, first in self.first.items():
            now = oom_kill_count(directory)
            if now is not None and now > first:
                total += now - first
        return total


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (``/proc``; 0 once it is gone)."""
    total = 0
    seen: set[int] = set()
    stack = [pid]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
                break
        try:
            tasks = Path(f"/proc/{current}/task").iterdir()
            for task in tasks:
                children = (task / "children").read_text().split()
                stack.extend(int(c) for c in children)
        except OSError:
            continue
    return total
