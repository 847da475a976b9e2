"""Prometheus metrics: HTTP counters/latency per route template, queue gauges from the DB.

HTTP metrics live in the process-wide default registry (with the process and GC
collectors). Queue gauges are computed at scrape time by :class:`QueueCollector`
from the ``job`` and ``worker`` tables, so every API replica reports the same
numbers and no background task is needed. With several uvicorn worker processes
(``curvplan serve --workers N``) prometheus_client's multiprocess mode is used: each
process writes its counters to ``PROMETHEUS_MULTIPROC_DIR`` and a scrape, whichever
process answers it, reports their sum.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, text

from curvplan.types.jobs import JOB_STATUSES, QUEUES

log = logging.getLogger(__name__)

HTTP_REQUESTS = Counter(
    "curvplan_http_requests_total",
    "HTTP requests by method, route template and status code.",
    ["method", "route", "status"],
)
HTTP_LATENCY = Histogram(
    "curvplan_http_request_duration_seconds",
    "HTTP request latency by method and route template.",
    ["method", "route"],
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)

_QUEUE_SQL = text(
    """
    SELECT queue, status, count(*) AS n,
           max(extract(epoch FROM now() - created_at)) FILTER (WHERE status = 'queued') AS oldest
    FROM job
    WHERE status IN ('queued', 'running', 'cancelling')
       OR finished_at > now() - interval '1 day'
    GROUP BY queue, status
    """
)
_WORKER_SQL = text(
    """
    SELECT count(*) FILTER (WHERE status = 'running'
                              AND last_heartbeat_at > now() - make_interval(secs => :stale)),
           count(*) FILTER (WHERE status = 'running' AND current_job_id IS NOT NULL
                              AND last_heartbeat_at > now() - make_interval(secs => :stale))
    FROM worker
    """
)


class QueueCollector(Collector):
    """Job counts by status and queue, oldest queued age, live and busy workers."""

    def __init__(self, engine: Engine, worker_stale_seconds: float) -> None:
        self.engine = engine
        self.worker_stale_seconds = worker_stale_seconds

    def describe(self) -> Iterator[Metric]:
        """The metric names, without values: registering the collector must not query.

        Without ``describe`` a registry with ``auto_describe`` calls :meth:`collect` at
        registration, i.e. a database round trip in ``create_app`` (and a logged
        traceback when the database is not up yet).
        """
        for name in (
            "curvplan_metrics_db_up",
            "curvplan_jobs",
            "curvplan_queue_oldest_queued_age_seconds",
            "curvplan_workers_live",
            "curvplan_workers_busy",
        ):
            yield GaugeMetricFamily(name, name)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("curvplan_metrics_db_up", "1 if the queue gauges could be read.")
        jobs = GaugeMetricFamily(
            "curvplan_jobs",
            "Jobs by queue and status (terminal statuses: finished in the last 24 h).",
            labels=["queue", "status"],
        )
        oldest = GaugeMetricFamily(
            "curvplan_queue_oldest_queued_age_seconds",
            "Age of the oldest queued job per queue (0 when the queue is empty).",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            "curvplan_workers_live", "Workers running with a fresh heartbeat."
        )
        busy = GaugeMetricFamily("curvplan_workers_busy", "Live workers running a job now.")
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(_QUEUE_SQL).all()
                live, running = conn.execute(
                    _WORKER_SQL, {"stale": self.worker_stale_seconds}
                ).one()
        except Exception:  # the scrape must still answer; the gauge says the DB is down
            log.warning("queue metrics: database unavailable", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        counts = {(q, s): 0 for q in QUEUES for s in JOB_STATUSES}
        oldest_by_queue = dict.fromkeys(QUEUES, 0.0)
        for queue, status, n, age in rows:
            counts[(queue, status)] = n
            if age is not None:
                oldest_by_queue[queue] = float(age)
        for (queue, status), n in counts.items():
            jobs.add_metric([queue, status], n)
        for queue, age in oldest_by_queue.items():
            oldest.add_metric([queue], age)
        workers.add_metric([], live or 0)
        busy.add_metric([], running or 0)
        up.add_metric([], 1)
        yield from (up, jobs, oldest, workers, busy)


def render_metrics(app_registry: CollectorRegistry) -> bytes:
    """The exposition text: HTTP metrics followed by the app's queue gauges.

    Under ``curvplan serve --workers N`` (``PROMETHEUS_MULTIPROC_DIR`` set) the HTTP
    counters and histograms are the sum over all N processes, read from their shared
    files, whichever process answers the scrape; otherwise this process's own registry.
    """
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry) + generate_latest(app_registry)
    return generate_latest(REGISTRY) + generate_latest(app_registry)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
