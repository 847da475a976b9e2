"""A worker's own metrics and health, on ``curvplan worker --metrics-port N``.

The API's ``/metrics`` shows the queue as the database sees it; this shows what one worker
process does: attempts by kind and outcome, attempt and stage durations, lease losses,
busy slots, the host memory of the running attempts, their device memory (CUDA allocated,
reserved and peak bytes per device as the attempt reports them; the resident memory of an
attempt that uses no CUDA, as device ``cpu``), and whether its heartbeats succeed.

* ``GET /metrics`` — Prometheus text (a registry of this process only);
* ``GET /healthz`` — 200 while every slot's heartbeat succeeded within the stale limit,
  else 503; JSON with each slot's worker id, current job and heartbeat age.

It binds 127.0.0.1 unless told otherwise (``--metrics-host``): job ids and hostnames are
operator information.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, TypedDict

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

DURATION_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)


def stage_label(stage: str) -> str:
    """A stage name without its counters ("block spectra 3/12" → "block spectra"), so the
    label set stays small."""
    return re.sub(r"\s+", " ", re.sub(r"[\d/.:%]+", " ", stage)).strip()[:60] or "unnamed"


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (Linux ``/proc``), None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class SlotHealth(TypedDict):
    """A worker slot in ``/healthz``: seconds since its last heartbeat, the job it runs."""

    heartbeat_age_seconds: float
    current_job_id: str | None


class WorkerHealth(TypedDict):
    """The ``/healthz`` body: ok while every slot's heartbeat is fresh."""

    status: Literal["ok", "unhealthy"]
    slots: dict[str, SlotHealth]


class WorkerMetrics:
    """The counters the slots update; safe to call from any thread."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.attempts = Counter(
            "curvplan_worker_attempts_total",
            "Attempts this worker ended, by job kind and outcome.",
            ["kind", "outcome"],
            registry=r,
        )
        self.attempt_seconds = Histogram(
            "curvplan_worker_attempt_duration_seconds",
            "Wall time of an attempt, claim to outcome.",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "curvplan_worker_stage_duration_seconds",
            "Wall time of each stage an attempt reported (counters stripped from the name).",
            ["kind", "stage"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.lease_lost = Counter(
            "curvplan_worker_lease_lost_total",
            "Attempts abandoned because their lease was lost.",
            registry=r,
        )
        self.heartbeat_failures = Counter(
            "curvplan_worker_heartbeat_failures_total", "Heartbeats that failed.", registry=r
        )
        self.busy = Gauge("curvplan_worker_busy_slots", "Slots running an attempt.", registry=r)
        self.slots = Gauge("curvplan_worker_slots", "Slots of this process.", registry=r)
        self.attempt_memory = Gauge(
            "curvplan_worker_attempt_memory_bytes",
            "Resident host memory of the running attempt processes (sum).",
            registry=r,
        )
        self.device_memory = Gauge(
            "curvplan_worker_device_memory_bytes",
            "Memory of the running attempts by device: CUDA allocated, reserved and peak "
            "(allocated since the attempt's start) per device; rss on device cpu for an "
            "attempt without CUDA.",
            ["device", "stat"],
            registry=r,
        )
        self._lock = threading.Lock()
        self._devices: dict[str, dict[str, dict[str, int]]] = {}
        self._children: dict[str, int] = {}
        self._beats: dict[str, float] = {}
        self._jobs: dict[str, str | None] = {}

    # ---------------------------------------------------------------- slot events
    def attempt_started(self, worker_id: str, job_id: str, child_pid: int) -> None:
        with self._lock:
            self._children[worker_id] = child_pid
            self._jobs[worker_id] = job_id
        self.busy.inc()

    def attempt_ended(self, worker_id: str, kind: str, outcome: str, seconds: float) -> None:
        with self._lock:
            self._children.pop(worker_id, None)
            self._devices.pop(worker_id, None)
            self._jobs[worker_id] = None
        self.busy.dec()
        self.attempts.labels(kind, outcome).inc()
        self.attempt_seconds.labels(kind).observe(seconds)

    def device_memory_report(self, worker_id: str, devices: dict[str, dict[str, int]]) -> None:
        """The latest device memory the slot's attempt reported (CUDA per device)."""
        with self._lock:
            self._devices[worker_id] = {d: dict(stats) for d, stats in devices.items()}

    def stage_ended(self, kind: str, stage: str, seconds: float) -> None:
        self.stage_seconds.labels(kind, stage_label(stage)).observe(seconds)

    def beat(self, worker_id: str, ok: bool) -> None:
        if ok:
            with self._lock:
                self._beats[worker_id] = time.monotonic()
        else:
            self.heartbeat_failures.inc()

    # ---------------------------------------------------------------- reading
    def render(self) -> bytes:
        with self._lock:
            children = dict(self._children)
            devices = {w: self._devices.get(w, {}) for w in children}
        rss = {w: rss_bytes(p) for w, p in children.items()}
        self.attempt_memory.set(sum(v for v in rss.values() if v is not None))
        totals: dict[tuple[str, str], int] = {}
        for worker_id, per_device in devices.items():
            if not per_device:  # no CUDA in this attempt: its resident memory
                per_device = {"cpu": {"rss": rss[worker_id] or 0}}
            for device, stats in per_device.items():
                for stat, value in stats.items():
                    totals[(device, stat)] = totals.get((device, stat), 0) + int(value)
        self.device_memory.clear()
        for (device, stat), value in totals.items():
            self.device_memory.labels(device, stat).set(value)
        return generate_latest(self.registry)

    def health(self, stale_seconds: float) -> tuple[bool, WorkerHealth]:
        now = time.monotonic()
        with self._lock:
            slots = {
                worker_id: SlotHealth(
                    heartbeat_age_seconds=round(now - at, 3),
                    current_job_id=self._jobs.get(worker_id),
                )
                for worker_id, at in self._beats.items()
            }
        ok = bool(slots) and all(s["heartbeat_age_seconds"] < stale_seconds for s in slots.values())
        return ok, WorkerHealth(status="ok" if ok else "unhealthy", slots=slots)


def serve(metrics: WorkerMetrics, host: str, port: int, stale_seconds: float) -> Callable[[], None]:
    """Serve ``/metrics`` and ``/healthz`` in a daemon thread; returns a stop function."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/metrics":
                self._send(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif self.path.split("?", 1)[0] == "/healthz":
                ok, body = metrics.health(stale_seconds)
                self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
            else:
                self._send(404, b'{"detail": "not found"}', "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="worker-metrics", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return stop
