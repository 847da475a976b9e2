"""The asynchronous client: :class:`AsyncClient` (same methods as :class:`Client`, awaited)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from curvplan.client import _common as c
from curvplan.client import models as m
from curvplan.client import precheck
from curvplan.client.errors import (
    ConnectionFailedError,
    NotFoundError,
    ServerError,
    WaitTimeoutError,
)

CheckpointArg = str | uuid.UUID | m.Artifact | Sequence[str | uuid.UUID | m.Artifact]
ProgressCallback = Callable[[m.JobOut], Awaitable[None] | None]


class AsyncClient:
    """Talk to a curvplan service from asyncio (like :class:`Client`, every method awaited).

    ``base_url`` defaults to ``$CURVPLAN_URL`` (else ``http://127.0.0.1:8000``) and
    ``api_key`` to ``$CURVPLAN_API_KEY``. Connection errors and 503 answers are
    retried with exponential backoff (:class:`RetryPolicy`); job submissions carry
    an ``Idempotency-Key`` (generated when not given) so a resend never makes a
    second job. Errors are :class:`curvplan.CurvplanError` subclasses carrying the
    server's problem+json fields. Use as an async context manager or await :meth:`aclose`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: c.RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: bool | str = True,
    ) -> None:
        self.base_url = c.resolve_base_url(base_url)
        self.retry = retry or c.RetryPolicy()
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=c.default_headers(c.resolve_api_key(api_key), headers),
            timeout=timeout,
            transport=transport,
            verify=verify,
        )

    # ------------------------------------------------------------------ plumbing
    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: c.Call, retry: c.RetryPolicy | None = None) -> Any:
        policy = retry or self.retry
        attempt = 0
        while True:
            try:
                response = await self._request(call)
            except httpx.TransportError as exc:
                if attempt < policy.max_retries and c.is_retryable_transport_error(exc, call):
                    await asyncio.sleep(policy.delay(attempt))
                    attempt += 1
                    continue
                raise c.connection_error(call, self.base_url, exc) from exc
            delay = c.retry_delay(policy, attempt, response, call)
            if delay is not None:
                await asyncio.sleep(delay)
                attempt += 1
                continue
            return c.decode(response, call)

    async def _request(self, call: c.Call) -> httpx.Response:
        timeout = httpx.USE_CLIENT_DEFAULT if call.timeout is None else call.timeout
        if call.upload is None:
            return await self._http.request(
                call.method,
                call.path,
                params=tuple(call.params) or None,
                json=call.json,
                headers=call.headers or None,
                timeout=timeout,
            )
        with call.upload.path.open("rb") as fh:  # streamed in chunks by httpx's multipart
            files = {"file": (call.upload.path.name, fh, "application/octet-stream")}
            return await self._http.request(
                call.method,
                call.path,
                data=call.upload.fields,
                files=files,
                headers=call.headers or None,
                timeout=httpx.Timeout(30.0, write=None, read=600.0),  # server validates it
            )

    # ------------------------------------------------------------------ service
    async def health(self) -> dict[str, str]:
        """``GET /healthz`` (no key needed)."""
        return await self._send(c.Call("GET", "/healthz"))

    # ------------------------------------------------------------------ artifacts
    async def upload_artifact(self, path: str | os.PathLike[str], kind: str) -> m.Artifact:
        """Upload a safetensors ``checkpoint`` or ``dataset`` file (streamed from disk).

        The server's sha256 is checked against the file's (ArtifactIntegrityError). The
        service is asked for the file's sha256 first: content this project already has is not
        uploaded again.
        """
        # async only: a multi-GB file is hashed in a worker thread, off the event loop.
        call, digest = await asyncio.to_thread(c.upload_call, path, kind)
        stored = precheck.stored_artifact(
            await self._send(precheck.lookup_call(kind, digest)), digest
        )
        if stored is not None:  # the project has this content already: nothing to send
            return stored
        answer = await self._send(call)
        c.check_artifact(answer, digest, call.upload.path)  # type: ignore[union-attr]
        return m.Artifact.model_validate(answer)

    async def get_artifact(self, artifact_id: str | uuid.UUID) -> m.Artifact:
        return m.Artifact.model_validate(
            await self._send(c.Call("GET", c.artifact_path(artifact_id)))
        )

    # ------------------------------------------------------------------ jobs
    async def submit_job(
        self, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> m.JobOut:
        """``POST /v1/jobs`` with a raw body (``{"kind": ...}``); see submit_plan/submit_analyze."""
        return m.JobOut.model_validate(await self._send(c.submit_call(body, idempotency_key)))

    async def submit_plan(
        self,
        measurements: Mapping[str, Any] | m.Measurements,
        targets: Mapping[str, Any] | m.Targets | None = None,
        *,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        max_attempts: int | None = None,
        webhook_url: str | None = None,
        idempotency_key: str | None = None,
    ) -> m.JobOut:
        """Queue a ``plan`` job from measurements you already have (docs/openapi.json).

        ``webhook_url`` is POSTed a signed event when the job ends (docs/integrations.md).
        """
        body = c.plan_body(measurements, targets, name, tags, max_attempts)
        return await self.submit_job(
            c.with_webhook(body, webhook_url), idempotency_key=idempotency_key
        )

    async def submit_analyze(
        self,
        model: Mapping[str, Any] | str | os.PathLike[str],
        checkpoint: CheckpointArg | None = None,
        dataset: str | uuid.UUID | m.Artifact | os.PathLike[str] | None = None,
        *,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        options: Mapping[str, Any] | None = None,
        targets: Mapping[str, Any] | m.Targets | None = None,
        intermediate_checkpoints: Sequence[CheckpointArg | str | os.PathLike[str]] = (),
        sweeps: Sequence[str | uuid.UUID | m.JobOut] = (),
        max_attempts: int | None = None,
        webhook_url: str | None = None,
        idempotency_key: str | None = None,
        on_upload: Callable[[Path], None] | None = None,
        devices: int | None = None,
        w_star: str | None = None,
    ) -> m.JobOut:
        """Queue an ``analyze`` job: a model, its checkpoint at w* and an evaluation sample.

        ``model`` is a reference model spec (with ``checkpoint``), or the path of a
        ``save_pretrained`` directory: its ``config.json`` is sent inline and every
        safetensors shard its ``model.safetensors.index.json`` names is uploaded (leave
        ``checkpoint`` out), or a Hugging Face ``Trainer`` output folder: its last
        ``checkpoint-<step>`` (or the one ``w_star`` names) is w*, every earlier one an
        intermediate checkpoint sent with its step and logged loss
        (docs/model-sources.md#trainer-run-folders). ``checkpoint``, ``dataset`` and each of
        ``intermediate_checkpoints`` may be artifacts, their ids, or local files (uploaded
        first; ``on_upload(path)`` is called before each); a checkpoint may also be a list
        of shards, an intermediate checkpoint a ``save_pretrained`` directory.
        ``intermediate_checkpoints`` (before convergence) give the gradient-noise scale,
        which is undefined at a converged w* (docs/formulas.md).
        ``sweeps`` (succeeded ``sweep`` jobs) give the budget its data-sweep, batch-sweep
        and branch-sweep (critical batch per checkpoint) fits (docs/budget.md).
        ``devices`` (``resources.devices``) runs the analysis on that
        many data-parallel devices of one worker (docs/operations.md#several-devices-per-job).
        """
        sources = c.analyze_sources(model, checkpoint, dataset, intermediate_checkpoints, w_star)
        body_fields = (name, tags, options, targets, max_attempts)
        placeholders = precheck.placeholder_ids(path for path, _ in sources.uploads())
        ckpt, data, intermediates = sources.resolved(placeholders)  # checked before uploading
        precheck.validate_job_body(
            c.with_intermediate_logs(
                c.analyze_body(
                    sources.model, ckpt, data, *body_fields, intermediates, sweeps, devices
                ),
                sources,
            )
        )
        uploaded: dict[Path, str] = {}
        for path, kind in sources.uploads():
            if on_upload is not None:
                on_upload(path)
            uploaded[path] = str((await self.upload_artifact(path, kind)).id)
        ckpt, data, intermediates = sources.resolved(uploaded)
        body = c.analyze_body(
            sources.model,
            ckpt,
            data,
            name,
            tags,
            options,
            targets,
            max_attempts,
            intermediates,
            sweeps,
            devices,
        )
        body = c.with_intermediate_logs(body, sources)
        return await self.submit_job(
            c.with_webhook(body, webhook_url), idempotency_key=idempotency_key
        )

    async def get_job(self, job_id: str | uuid.UUID) -> m.JobOut:
        return m.JobOut.model_validate(await self._send(c.Call("GET", c.job_path(job_id))))

    async def list_jobs(
        self,
        *,
        status: str | list[str] | None = None,
        kind: str | None = None,
        name: str | None = None,
        tags: Mapping[str, str] | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> m.JobPage:
        """One page of the project's jobs, newest first."""
        params = c.list_params(status, kind, name, tags, page_size, page_token)
        return m.JobPage.model_validate(await self._send(c.Call("GET", "/v1/jobs", params=params)))

    async def iter_jobs(self, **filters: Any) -> AsyncIterator[m.JobOut]:
        """Every matching job, newest first, following the page tokens."""
        token: str | None = None
        while True:
            page = await self.list_jobs(page_token=token, **filters)
            for job in page.items:
                yield job
            token = page.next_page_token
            if not token:
                return

    async def cancel_job(self, job_id: str | uuid.UUID) -> m.JobOut:
        """Queued → cancelled at once; running → cancelling; terminal → ConflictError."""
        call = c.Call("POST", c.job_path(job_id, "/cancel"), idempotent=False)
        return m.JobOut.model_validate(await self._send(call))

    async def wait(
        self,
        job_id: str | uuid.UUID,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
        *,
        progress_interval: float = 1.0,
    ) -> m.JobOut:
        """Long-poll until the job is terminal; return it (whatever its status).

        ``on_progress(job)`` is called whenever its status or progress changes; with
        a callback the client re-polls every ``progress_interval`` seconds so the
        progress stays live, without one it holds each request up to 30 s. An
        unreachable server or 503 is ridden out for ``retry.outage_seconds`` (a
        restart mid-wait is survived). Raises :class:`WaitTimeoutError` after
        ``timeout`` seconds (``None``: no limit).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        chunk = progress_interval if on_progress is not None else c.LONG_POLL_SECONDS
        last_key: tuple[Any, ...] | None = None
        last_job: m.JobOut | None = None
        failures = 0
        outage_since: float | None = None
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            hold = chunk if remaining is None else max(0.0, min(chunk, remaining))
            try:
                job = m.JobOut.model_validate(
                    await self._send(c.wait_call(job_id, hold), c.NO_RETRY)
                )
            except (ConnectionFailedError, ServerError) as exc:
                if isinstance(exc, ServerError) and exc.status not in (502, 503, 504):
                    raise
                now = time.monotonic()
                outage_since = outage_since if outage_since is not None else now
                if deadline is not None and now >= deadline:
                    raise WaitTimeoutError(
                        f"job {job_id} did not finish within {timeout} s (the service was "
                        f"unavailable at the end: {exc})",
                        job=last_job,
                    ) from exc
                if now - outage_since >= self.retry.outage_seconds:
                    raise
                pause = self.retry.delay(failures)
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - now))
                await asyncio.sleep(pause)
                failures += 1
                continue
            failures, outage_since, last_job = 0, None, job
            key = c.progress_key(job)
            if on_progress is not None and key != last_key:
                outcome = on_progress(job)
                if asyncio.iscoroutine(outcome):
                    await outcome
            last_key = key
            if m.is_terminal(job):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(
                    f"job {job_id} is still {job.status} after {timeout} s", job=last_job
                )

    # ------------------------------------------------------------------ recommendations
    async def get_recommendation(self, job_id: str | uuid.UUID) -> m.Recommendation:
        """The recommendation of a succeeded job (ConflictError while it has not succeeded)."""
        answer = await self._send(c.Call("GET", c.job_path(job_id, "/recommendation")))
        return m.Recommendation.model_validate(answer)

    async def list_recommendations(
        self,
        name: str | None = None,
        *,
        tags: Mapping[str, str] | None = None,
        kind: str | None = None,
        page_size: int | None = None,
    ) -> list[m.RecommendationEntry]:
        """For each job name (or only ``name``), the recommendation of its latest succeeded job."""
        params = c.list_params(None, kind, name, tags, page_size, None)
        answer = await self._send(c.Call("GET", "/v1/recommendations", params=params))
        return m.RecommendationPage.model_validate(answer).items

    async def latest_recommendation(
        self, name: str, *, tags: Mapping[str, str] | None = None, kind: str | None = None
    ) -> m.RecommendationEntry:
        """The recommendation of the newest succeeded job named ``name`` (NotFoundError if none)."""
        items = await self.list_recommendations(name, tags=tags, kind=kind, page_size=1)
        if not items:
            raise NotFoundError(f"no succeeded job named {name!r} has a recommendation", status=404)
        return items[0]

    # ------------------------------------------------------------------ reports
    async def report_link(self, job_id: str | uuid.UUID) -> m.ReportLink:
        """A short-lived signed URL of the job's report page, to open in a browser."""
        call = c.Call("POST", c.job_path(job_id, "/report-link"))
        link = m.ReportLink.model_validate(await self._send(call))
        return c.absolute_link(link, self.base_url)

    async def get_report_html(self, job_id: str | uuid.UUID) -> str:
        """The job's report page (HTML, self-contained)."""
        call = c.Call("GET", c.job_path(job_id, "/report"), expect="text")
        return await self._send(call)

    async def list_plots(self, job_id: str | uuid.UUID) -> m.PlotList:
        """The report's figures: which are drawn (with their SVG/PNG paths) and which are empty."""
        call = c.Call("GET", c.job_path(job_id, "/plots"))
        return m.PlotList.model_validate(await self._send(call))

    async def get_plot(self, job_id: str | uuid.UUID, name: str, fmt: str = "png") -> bytes:
        """One figure of the report as ``svg`` or ``png`` bytes (drawn by the service)."""
        call = c.Call("GET", c.plot_path(job_id, name, fmt), expect="bytes")
        return await self._send(call)

    # ------------------------------------------------------------------ webhooks
    async def create_webhook_secret(
        self, overlap_seconds: float | None = None
    ) -> m.WebhookSecretOut:
        """A new signing secret for the project's webhooks; the old one keeps signing beside
        it for ``overlap_seconds`` (default: the service's; 0: it stops at once)."""
        params = [] if overlap_seconds is None else [("overlap_seconds", str(overlap_seconds))]
        call = c.Call("POST", "/v1/webhooks/secret", params=params, idempotent=False)
        return m.WebhookSecretOut.model_validate(await self._send(call))

    async def list_webhook_deliveries(self, job_id: str | uuid.UUID) -> m.WebhookDeliveryList:
        """The job's webhook deliveries, each with every attempt."""
        call = c.Call("GET", c.job_path(job_id, "/webhooks"))
        return m.WebhookDeliveryList.model_validate(await self._send(call))
