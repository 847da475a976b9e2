"""The FastAPI application: ``create_app(settings)``.

Run with ``curvplan serve`` or ``uvicorn --factory curvplan_server.main:create_app``.
This module never imports torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from pydantic import JsonValue

from curvplan.types.jobs import CLIENT_JOB_CREATE_ADAPTER
from curvplan.types.problems import ProblemDocument
from curvplan_core.config import Settings, get_settings
from curvplan_core.db import make_engine, make_sessionmaker
from curvplan_core.logging import configure_logging
from curvplan_core.notify import JobNotifier
from curvplan_server.agents.router import router as agents_router
from curvplan_server.artifacts.router import UPLOAD_OVERHEAD_BYTES
from curvplan_server.artifacts.router import router as artifacts_router
from curvplan_server.auth.dependencies import KeyCache
from curvplan_server.db_unavailable import install_unavailable_handlers
from curvplan_server.docs_ui import install_docs
from curvplan_server.health.router import router as health_router
from curvplan_server.jobs.router import router as jobs_router
from curvplan_server.metrics import QueueCollector
from curvplan_server.middleware import (
    BodySizeLimitMiddleware,
    FiniteNumbersMiddleware,
    MetricsMiddleware,
)
from curvplan_server.problems import install_problem_handlers
from curvplan_server.public_url import AllowedHostsMiddleware, PublicLocationMiddleware
from curvplan_server.ratelimit.limiter import RateLimiter
from curvplan_server.recommendations.router import router as recommendations_router
from curvplan_server.reports.router import router as reports_router
from curvplan_server.request_id import install_request_id
from curvplan_server.storage.housekeeping import temp_sweeper
from curvplan_server.storage.router import router as storage_router
from curvplan_server.webhooks.router import router as webhooks_router
from curvplan_server.workers.blobs import WORKER_BLOBS_PREFIX
from curvplan_server.workers.blobs import router as worker_blobs_router
from curvplan_server.workers.router import router as workers_router

API_VERSION = "0.1.0"


def _operation_id(route: APIRoute) -> str:
    return route.name


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the API for ``settings`` (default: from the environment)."""
    settings = settings or get_settings()
    configure_logging(settings.log_format, settings.log_level)
    engine = make_engine(settings, pre_ping=False)

    # Threads for the blocking DB calls of the hot path, one per pooled connection.
    db_executor = ThreadPoolExecutor(
        max_workers=settings.db_pool_size + settings.db_max_overflow,
        thread_name_prefix="curvplan-db",
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        notifier = None
        if settings.job_notify:  # one LISTEN connection per process wakes the long-polls
            notifier = JobNotifier(settings.sqlalchemy_url)
            notifier.start(asyncio.get_running_loop())
        app.state.job_notifier = notifier
        async with temp_sweeper(settings):  # files a killed upload left in blobs/tmp
            yield
        if notifier is not None:
            notifier.stop()
        db_executor.shutdown(wait=True)
        engine.dispose()

    app = FastAPI(
        title="curvplan",
        version=API_VERSION,
        description="Data-budgeting planner for Transformers: jobs that turn curvature "
        "measurements into sample sizes and critical batch sizes.",
        generate_unique_id_function=_operation_id,
        lifespan=lifespan,
        docs_url=None,  # served from the installed Swagger UI by install_docs (no CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.db_executor = db_executor
    app.state.key_cache = KeyCache(settings.auth_cache_seconds)
    app.state.rate_limiter = RateLimiter(settings.rate_limits)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(QueueCollector(engine, settings.worker_stale_seconds))
    app.state.metrics_registry = registry

    install_problem_handlers(app)
    install_unavailable_handlers(app)
    app.include_router(health_router)
    app.include_router(jobs_router)
    app.include_router(reports_router)
    app.include_router(artifacts_router)
    app.include_router(storage_router)
    app.include_router(recommendations_router)
    app.include_router(workers_router)
    app.include_router(worker_blobs_router)
    app.include_router(webhooks_router)
    app.include_router(agents_router)
    install_docs(app)
    # Outermost last: metrics see every request, including 413s from the size limit.
    # Inside the size limit: a JSON body is read (bounded) and refused when not finite.
    app.add_middleware(
        FiniteNumbersMiddleware, skip_prefixes=("/v1/artifacts", WORKER_BLOBS_PREFIX)
    )
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        path_limits={
            "/v1/artifacts": settings.max_artifact_bytes + UPLOAD_OVERHEAD_BYTES,
            WORKER_BLOBS_PREFIX: settings.worker_upload_max_bytes,
        },
    )
    app.add_middleware(MetricsMiddleware)
    if settings.public_url:
        app.add_middleware(PublicLocationMiddleware, public_url=settings.public_url)
    else:  # outermost: a request naming another host is refused before anything runs
        app.add_middleware(AllowedHostsMiddleware, allowed_hosts=list(settings.allowed_hosts))
    install_request_id(app)  # outside everything: every answer, 500s included, has the id
    _install_openapi(app)
    return app


def _install_openapi(app: FastAPI) -> None:
    """Add the job-create body schema (validated by hand for speed) and the problem document
    (every error answer, ``application/problem+json``) to the OpenAPI document."""
    default_openapi = app.openapi

    def openapi() -> dict[str, JsonValue]:  # the OpenAPI document: JSON
        if app.openapi_schema:
            return app.openapi_schema
        schema = default_openapi()
        body_schema = CLIENT_JOB_CREATE_ADAPTER.json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in body_schema.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components["JobCreate"] = body_schema
        problem_schema = ProblemDocument.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        for name, definition in problem_schema.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components["ProblemDocument"] = problem_schema
        schema["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "curvplan API key"}
        }
        for path, operations in schema["paths"].items():
            if path.startswith("/v1/"):
                for operation in operations.values():
                    operation["security"] = [{"bearer": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
