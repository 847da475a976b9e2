"""A worker process's tuning: :class:`WorkerOptions`, filled from the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from curvplan.types.jobs import QUEUES, job_time_limit
from curvplan_core.config import Settings
from curvplan_worker.memstats import worker_memory_limit

VALID_QUEUES = QUEUES


@dataclass(frozen=True)
class WorkerOptions:
    """Tuning of a worker process; :meth:`from_settings` fills it from the environment."""

    database_url: str
    queues: tuple[str, ...]
    data_dir: Path
    concurrency: int = 1
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 5.0
    poll_interval: float = 1.0
    reaper_interval: float = 5.0
    backoff_base: float = 2.0
    backoff_max: float = 300.0
    worker_stale_seconds: float = 60.0
    cancel_grace_seconds: float = 1.0
    shutdown_grace_seconds: float = 30.0
    start_method: str = "forkserver"
    log_format: str = "console"
    log_level: str = "INFO"
    #: Seconds an attempt of a kind may run before it is killed (error type ``timeout``): the
    #: operator's overrides of the kinds' declared limits (:meth:`time_limit`).
    time_limits: Mapping[str, float] = field(default_factory=dict)
    default_time_limit: float = 86400.0
    #: Idle slots wait on LISTEN/NOTIFY for new jobs; the database is then polled only
    #: every ``notify_fallback_seconds`` (``poll_interval`` without notifications).
    notify: bool = True
    notify_fallback_seconds: float = 15.0
    #: Serve this process's /metrics and /healthz here (None: off).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: Devices one job may use (data-parallel ranks); jobs asking for more are left to others.
    devices: int = 1
    #: Touched after every heartbeat the database accepted: the worker's health signal
    #: (``curvplan worker-health`` checks its age; the Docker image's HEALTHCHECK runs it).
    health_file: Path | None = None
    #: Storage garbage collection (docs/storage.md): a pass every ``gc_interval_seconds``
    #: (None: never) over stale temp files, expired jobs and unreferenced blobs.
    gc_interval_seconds: float | None = None
    job_retention_days: float | None = None
    blob_gc_grace_seconds: float = 600.0
    temp_file_max_age_seconds: float = 3600.0
    # Webhooks: the sender thread's policy and pacing (Settings.webhook_*).
    webhook_allowed_hosts: tuple[str, ...] = ()
    webhook_allowed_networks: tuple[str, ...] = ()
    webhook_max_attempts: int = 8
    webhook_backoff_seconds: float = 10.0
    webhook_timeout_seconds: float = 10.0
    webhook_project_concurrency: int = 4
    webhook_breaker_failures: int = 3
    webhook_poll_seconds: float = 1.0
    public_url: str | None = None
    #: A worker on another host (``CURVPLAN_URL``): each slot creates its own ``worker``
    #: credential through the database and its attempts move blobs through this API.
    api_url: str | None = None
    #: Host memory one job may hold, its processes together (None: unbounded), and whence.
    memory_limit_bytes: int | None = None
    memory_limit_source: str = ""
    #: How often the supervisor reads its child's resident memory against that limit.
    memory_poll_seconds: float = 0.25
    #: The factor on the micro-batch of the one retry after an out-of-memory end.
    oom_micro_batch_factor: float = 0.5

    def time_limit(self, kind: str) -> float:
        """The time limit of ``kind``'s attempts (:func:`curvplan.types.jobs.job_time_limit`)."""
        return job_time_limit(kind, self.time_limits, self.default_time_limit)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.queues) - set(VALID_QUEUES))
        if not self.queues or unknown:
            raise ValueError(f"queues must be a non-empty subset of {VALID_QUEUES}, got {unknown}")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.devices < 1:
            raise ValueError("devices must be at least 1")
        if self.lease_seconds <= 0 or self.poll_interval <= 0 or self.reaper_interval <= 0:
            raise ValueError("lease_seconds, poll_interval and reaper_interval must be positive")
        if not 0 < self.heartbeat_seconds <= self.lease_seconds / 2:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds}) must be positive and at most "
                f"half of lease_seconds ({self.lease_seconds}), or leases expire between beats"
            )
        if self.start_method not in ("forkserver", "spawn"):
            # ``fork`` would copy the threads and other slots' pipes into every child.
            raise ValueError("start_method must be 'forkserver' or 'spawn'")
        for name in ("cancel_grace_seconds", "shutdown_grace_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @classmethod
    def from_settings(
        cls, settings: Settings, queues: list[str], **overrides: object
    ) -> WorkerOptions:
        """Options from ``Settings`` (environment), then ``overrides`` that are not None.

        When only ``lease_seconds`` is overridden, the heartbeat defaults to a third of
        the lease (never more than the configured heartbeat).
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        lease = float(given.get("lease_seconds", settings.lease_seconds))  # type: ignore[arg-type]
        heartbeat = given.get("heartbeat_seconds", min(settings.heartbeat_seconds, lease / 3))
        base = cls(
            database_url=settings.sqlalchemy_url,
            queues=tuple(queues),
            data_dir=settings.data_dir,
            lease_seconds=lease,
            heartbeat_seconds=float(heartbeat),  # type: ignore[arg-type]
            reaper_interval=min(5.0, lease / 2),
            backoff_base=settings.retry_backoff_base_seconds,
            backoff_max=settings.retry_backoff_max_seconds,
            worker_stale_seconds=max(settings.worker_stale_seconds, 2 * lease),
            log_format=settings.log_format,
            log_level=settings.log_level,
            time_limits=dict(settings.job_time_limits),
            default_time_limit=settings.default_job_time_limit,
            notify=settings.job_notify,
            notify_fallback_seconds=settings.notify_fallback_seconds,
            health_file=settings.worker_health_file,
            gc_interval_seconds=settings.gc_interval_seconds or None,
            job_retention_days=settings.job_retention_days,
            blob_gc_grace_seconds=settings.blob_gc_grace_seconds,
            temp_file_max_age_seconds=settings.temp_file_max_age_seconds,
            webhook_allowed_hosts=tuple(settings.webhook_allowed_hosts),
            webhook_allowed_networks=tuple(settings.webhook_allowed_networks),
            webhook_max_attempts=settings.webhook_max_attempts,
            webhook_backoff_seconds=settings.webhook_backoff_seconds,
            webhook_timeout_seconds=settings.webhook_timeout_seconds,
            webhook_project_concurrency=settings.webhook_project_concurrency,
            webhook_breaker_failures=settings.webhook_breaker_failures,
            public_url=settings.public_url,
            devices=settings.worker_devices,
            api_url=settings.worker_api_url,
        )
        rest = {k: v for k, v in given.items() if k not in ("lease_seconds", "heartbeat_seconds")}
        options = replace(base, **rest)  # type: ignore[arg-type]
        if "memory_limit_bytes" not in given:
            limit = worker_memory_limit()  # ValueError naming CURVPLAN_WORKER_MEMORY_LIMIT
            if limit is not None:
                limit = limit.per_slot(options.concurrency)
                options = replace(
                    options, memory_limit_bytes=limit.bytes, memory_limit_source=limit.source
                )
        return options
