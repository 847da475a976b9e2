"""Service settings: the one place where the environment is read.

Every process (API, worker, CLI) builds a :class:`Settings` from the environment;
nothing else reads ``os.environ`` for configuration.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from curvplan.types.jobs import job_time_limit
from curvplan.types.options import MachineSettings, parse_byte_size


def normalise_database_url(url: str) -> str:
    """Return ``url`` with the psycopg 3 driver spelled out.

    Accepts ``postgres://``, ``postgresql://`` and ``postgresql+psycopg2://`` (what
    Heroku-style platforms and libpq users write) and rewrites them to
    ``postgresql+psycopg://`` so that SQLAlchemy uses psycopg 3.
    """
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def libpq_url(url: str) -> str:
    """Return ``url`` as a plain libpq URL (``postgresql://``) for psycopg.connect."""
    url = normalise_database_url(url)
    return "postgresql://" + url[len("postgresql+psycopg://") :]


class Settings(BaseSettings):
    """Configuration for the API, the workers and the CLI (environment variables)."""

    model_config = SettingsConfigDict(env_prefix="CURVPLAN_", extra="ignore", populate_by_name=True)

    database_url: str | None = Field(
        default=None,
        validation_alias="DATABASE_URL",
        description="PostgreSQL URL; unset means `curvplan dev` starts an embedded server.",
    )
    data_dir: Path = Field(default=Path("./.curvplan"), description="Files: blobs, embedded PG.")
    auth_disabled: bool = Field(
        default=False,
        description="Serve /v1 without API keys (all requests act as project `default`). "
        "Only for local experiments; must be switched on explicitly.",
    )
    auth_cache_seconds: float = Field(
        default=5.0, ge=0, description="Cache key lookups this long (revocation delay)."
    )
    log_format: Literal["json", "console"] = "console"
    log_level: str = "INFO"
    access_log: bool = Field(default=True, description="uvicorn access log lines (INFO).")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    max_artifact_bytes: int = Field(
        default=4 * 1024**3, gt=0, description="Largest artifact upload (POST /v1/artifacts)."
    )
    max_safetensors_header_bytes: int = Field(
        default=10_000_000,
        gt=0,
        le=100_000_000,
        description="Longest safetensors header an upload may have (bytes; the header is "
        "held and parsed in the API process); longer is a 413.",
    )
    max_safetensors_tensors: int = Field(
        default=100_000,
        gt=0,
        description="Most tensors one safetensors header may list; more is a 422.",
    )
    upload_header_memory_bytes: int = Field(
        default=1024**3,
        gt=0,
        description="API memory the safetensors headers of concurrent uploads may hold while "
        "they are checked (each ~15 × its header's length); an upload beyond it gets 503 with "
        "Retry-After (one upload is always admitted).",
    )
    max_safetensors_metadata_bytes: int = Field(
        default=1_048_576,
        gt=0,
        le=100_000_000,
        description="Bytes of __metadata__ (keys and values) a safetensors upload may carry; "
        "more is a 413. An artifact's metadata is read in pages from "
        "GET /v1/artifacts/{id}/metadata; reads and lists show a bounded preview.",
    )
    artifact_tensor_preview: int = Field(
        default=100,
        ge=0,
        le=10_000,
        description="Tensors an artifact's metadata lists (the first, by name); the rest are "
        "paged from GET /v1/artifacts/{id}/tensors.",
    )
    artifact_uri_roots: list[Path] = Field(
        default_factory=list,
        description="Directories file:// artifacts must lie under (JSON list, e.g. "
        '["/mnt/models"]); empty (the default): file:// artifacts are refused. Set it on '
        "the API and on every worker.",
    )
    job_time_limits: dict[str, float] = Field(
        default_factory=dict,
        description="Seconds an attempt of each job kind may run before it is killed and "
        'the job fails with error type "timeout" (JSON object, e.g. {"plan": 900}); a kind '
        "without an entry has the limit it declares (plan 900 s, analyze 86400 s).",
    )
    default_job_time_limit: float = Field(
        default=86400.0,
        gt=0,
        description="Time limit of a kind without an entry above that declares none.",
    )
    max_model_parameters: int | None = Field(
        default=2_000_000_000,
        gt=0,
        description="Largest Hugging Face model (parameters, computed from its config.json) "
        "an analyze job may name; checked before the job is queued.",
    )
    plan_max_loss_evaluations: int = Field(
        default=20_000_000,
        gt=0,
        description="Most planner work one plan job may ask for: (losses + perturbed "
        "losses) × targets.orderings; more is a 422 naming targets.orderings.",
    )
    plan_max_bootstrap: int = Field(
        default=10_000,
        ge=0,
        description="Most bootstrap draws (targets.bootstrap) one plan job may ask for; more "
        "is a 422.",
    )
    max_job_devices: int = Field(
        default=8,
        ge=1,
        description="Most devices (resources.devices) one analyze job may ask for; more is a "
        "422. A job within it waits until a worker with that many devices is live.",
    )
    worker_devices: int = Field(
        default=1,
        ge=1,
        description="Devices this worker gives one job (data-parallel ranks); it claims only "
        "jobs asking for at most this many.",
    )
    db_pool_size: int = Field(default=10, gt=0)
    db_max_overflow: int = Field(default=10, ge=0)

    # Storage clean-up and quotas (docs/storage.md).
    project_max_storage_bytes: int | None = Field(
        default=None, gt=0, description="Bytes of uploaded artifacts per project; unset: no limit."
    )
    project_max_artifacts: int | None = Field(
        default=None, gt=0, description="Uploaded/registered artifacts per project; unset: none."
    )
    temp_file_max_age_seconds: float = Field(
        default=3600.0, gt=0, description="Upload/output temp files untouched this long are swept."
    )
    storage_sweep_seconds: float = Field(
        default=600.0, gt=0, description="How often each API process sweeps stale temp files."
    )
    job_retention_days: float | None = Field(
        default=None,
        gt=0,
        description="Delete finished jobs (and their outputs) this old; unset: keep forever.",
    )
    blob_gc_grace_seconds: float = Field(
        default=600.0, ge=0, description="Unreferenced blobs younger than this are kept."
    )
    gc_interval_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="How often a worker runs a GC pass (temp files, retention, blobs); "
        "0: never (run `curvplan gc`).",
    )

    # Jobs and workers (docs/layout.md).
    lease_seconds: float = Field(default=30.0, gt=0)
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    retry_backoff_base_seconds: float = Field(default=2.0, ge=0)
    retry_backoff_max_seconds: float = Field(default=300.0, ge=0)
    worker_stale_seconds: float = Field(
        default=60.0, gt=0, description="A worker without heartbeat for this long is not live."
    )
    # How a worker runs the curvature engine (MachineSettings; never a request option).
    worker_device: str = Field(default="auto", description="auto, cpu or cuda[:index]")
    worker_threads: int | None = Field(default=None, ge=1, description="torch intra-op threads")
    worker_self_test: bool = Field(
        default=True, description="Check HVPs against finite differences before each analysis."
    )
    worker_health_file: Path | None = Field(
        default=None,
        description="A worker touches this file after every heartbeat the database accepted "
        "(`curvplan worker-health` checks its age).",
    )
    worker_cache_graph: bool = Field(
        default=True, description="Keep the gradient graph between products (false: less memory)."
    )
    worker_memory_budget: int | None = Field(
        default=None,
        description="Bytes the curvature products of a job may use on top of the model and "
        "data, e.g. 8GiB (docs/numerics.md#memory-plan); unset: free CUDA memory × 0.9, "
        "unbounded on CPU.",
    )

    worker_basis_budget: int = Field(
        default=2 * 1024**3,
        ge=1,
        description="Bytes one block's Lanczos basis may hold, e.g. 2GiB: at most "
        "min(32, budget / (n · 4 bytes)) vectors, or up to min(16 MiB, budget) of them (at "
        "most 320) for a small block (docs/numerics.md#bounded-basis).",
    )
    worker_memory_limit: int | None = Field(
        default=None,
        description="Host memory one job of a worker may use, e.g. 24GiB (a worker without it "
        "uses its cgroup's limit, else MemAvailable; docs/operations.md#memory-limit). Set on "
        "the API too, it refuses at submission (too-large) an analysis that cannot fit it.",
    )
    fan_out_min_seconds: float = Field(
        default=60.0,
        ge=0,
        description="An analysis whose block spectra are estimated to take longer than this "
        "(and with two or more gpu worker slots live) fans out into analyze_blocks jobs at "
        "submission; a shorter one runs in one process (options.fan_out forces either).",
    )

    @field_validator(
        "worker_memory_budget", "worker_basis_budget", "worker_memory_limit", mode="before"
    )
    @classmethod
    def _byte_size(cls, value: Any, info: Any) -> int | None:
        try:
            return parse_byte_size(value)
        except ValueError as exc:
            raise ValueError(f"CURVPLAN_{info.field_name.upper()}: {exc}") from None

    # Workers on other hosts (docs/operations.md, "Workers on other hosts").
    worker_api_url: str | None = Field(
        default=None,
        validation_alias="CURVPLAN_URL",
        description="The API's base URL as a worker reaches it: blobs missing from the local "
        "store are fetched (and outputs uploaded) through it; unset: one shared data dir.",
    )
    worker_cache_bytes: int = Field(
        default=20 * 1024**3,
        gt=0,
        description="Size bound of a worker's blob cache (<data dir>/cache; LRU eviction).",
    )
    worker_http_timeout_seconds: float = Field(
        default=60.0, gt=0, description="Connect/read timeout of a worker's blob transfers."
    )
    worker_upload_max_bytes: int = Field(
        default=64 * 1024**3,
        gt=0,
        description="Largest output blob the API accepts from a worker (PUT /v1/worker/blobs).",
    )
    long_poll_max_seconds: float = Field(default=60.0, gt=0)
    long_poll_interval_seconds: float = Field(
        default=0.2, gt=0, description="Long-poll re-check interval without notifications."
    )
    job_notify: bool = Field(
        default=True,
        description="Wait on PostgreSQL LISTEN/NOTIFY for job changes (long-polls, idle "
        "workers); polling remains only as the fallback below.",
    )
    notify_fallback_seconds: float = Field(
        default=15.0, gt=0, description="With notifications: re-check the database this often."
    )
    default_page_size: int = Field(default=50, ge=1)
    max_page_size: int = Field(default=500, ge=1)

    # Report pages: signed links let a browser open a report without the key.
    report_link_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of signed report links; set the same value on every API "
        "process. Unset: a random key is kept in DATA_DIR/report-link-secret.",
    )

    @field_validator("report_link_secret")
    @classmethod
    def _non_empty_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("report_link_secret must not be empty (unset it to use a key file)")
        return value

    report_link_seconds: float = Field(
        default=900.0, gt=0, le=7 * 24 * 3600, description="Lifetime of a signed report link."
    )

    # Rate limits (docs/operations.md#rate-limits): kept in PostgreSQL, shared by every API
    # process; defaults a team's pipelines do not reach and a runaway loop does at once.
    rate_limits: bool = Field(
        default=True, description="Enforce the rate limits below (429 + Retry-After)."
    )
    rate_limit_window_seconds: float = Field(
        default=60.0, gt=0, le=86400, description="The window of every rate limit below."
    )
    rate_limit_submissions_per_key: int = Field(
        default=300,
        ge=1,
        description="Job submissions (POST /v1/jobs) one API key may make per window (a burst "
        "of that many, then one every window/limit seconds).",
    )
    rate_limit_submissions_per_project: int = Field(
        default=600,
        ge=1,
        description="Job submissions one project may make per window, all its keys together.",
    )
    rate_limit_failed_auth_per_address: int = Field(
        default=30,
        ge=1,
        description="Requests with an invalid or revoked key one client address may make per "
        "window; past it, keys not already known to the process are not looked up (429).",
    )

    # Webhooks (docs/integrations.md): callbacks only to hosts the operator lists.
    webhook_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts a job's webhook_url may name (JSON list; '*.example.com' matches "
        "subdomains, '*' any host). Empty: webhooks are off.",
    )
    webhook_allowed_networks: list[str] = Field(
        default_factory=list,
        description="CIDRs exempt from the private-address refusal (loopback, link-local, "
        'metadata, private ranges are refused otherwise), e.g. ["10.1.0.0/16"].',
    )
    webhook_max_attempts: int = Field(default=8, ge=1, le=50)
    webhook_backoff_seconds: float = Field(
        default=10.0, gt=0, description="First retry delay; doubles per attempt (max 1 h)."
    )
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    webhook_project_concurrency: int = Field(
        default=4,
        ge=1,
        description="Most webhook deliveries of one project in flight at once (all workers "
        "together); the rest of the senders' slots stay free for other projects.",
    )
    webhook_breaker_failures: int = Field(
        default=3,
        ge=1,
        description="Consecutive failed deliveries (no answer, 5xx, 408, 429) to one endpoint "
        "of a project that back it off as a whole (circuit breaker); it reopens for one probe "
        "after webhook_backoff_seconds, doubling per further failure (max 1 h).",
    )
    webhook_secret_overlap_seconds: float = Field(
        default=86400.0,
        ge=0,
        le=30 * 86400,
        description="After a secret rotation the old secret keeps signing beside the new one "
        "this long (a second webhook-signature entry), so receivers can switch over.",
    )
    public_url: str | None = Field(
        default=None,
        description="The service's public base URL (e.g. https://curvplan.example.com): every "
        "absolute URL the API writes (report links, redirects) and webhook links start with "
        "it. Unset: the request's Host must be one of allowed_hosts.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1"],
        description="Host names requests may name when public_url is unset (JSON list; "
        "'*.example.com' matches subdomains, '*' any host); others get 400.",
    )
    forwarded_allow_ips: list[str] = Field(
        default_factory=list,
        description="Addresses of the proxies whose X-Forwarded-For/-Proto headers "
        "`curvplan serve` honours (uvicorn's forwarded_allow_ips); empty: none.",
    )

    @field_validator("worker_api_url")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        return value.rstrip("/") or None if value else None

    @field_validator("database_url")
    @classmethod
    def _normalise(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        return normalise_database_url(value)

    def job_time_limit(self, kind: str) -> float:
        """Seconds an attempt of ``kind`` may run (its override here, else its declared
        limit, else the default: :func:`curvplan.types.jobs.job_time_limit`)."""
        return job_time_limit(kind, self.job_time_limits, self.default_job_time_limit)

    def machine_settings(self) -> MachineSettings:
        """The engine's machine settings of this worker (ValueError naming a bad one)."""
        return MachineSettings(
            device=self.worker_device,
            threads=self.worker_threads,
            self_test=self.worker_self_test,
            cache_graph=self.worker_cache_graph,
            memory_budget=self.worker_memory_budget,
            basis_budget=self.worker_basis_budget,
        )

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL to connect to; raises if none is configured."""
        if self.database_url is None:
            raise RuntimeError(
                "DATABASE_URL is not set; set it, or run `curvplan dev` for an embedded server"
            )
        return self.database_url


@lru_cache
def get_settings() -> Settings:
    """Settings from the environment, read once per process."""
    return Settings()
