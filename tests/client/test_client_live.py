"""The client against real ``curvplan serve`` + ``curvplan worker`` processes."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import threading
import time
import uuid
from typing import Any

import httpx
import pytest
from analyze_files import OPTIONS, SPEC, TARGETS, write_analyze_files
from live_plugin import LiveService
from plan_bodies import full_measurements, full_targets, slow_plan, small_plan

import curvplan
from curvplan.client import (
    AuthenticationError,
    ConflictError,
    ConnectionFailedError,
    NotFoundError,
    RetryPolicy,
    ValidationFailedError,
    WaitTimeoutError,
)
from curvplan.types.jobs import JobOut, JobPage
from curvplan.types.planner import Recommendation
from curvplan.types.results import AnalyzeResult

pytestmark = pytest.mark.e2e


@pytest.fixture
def api(live: LiveService) -> Any:
    with curvplan.Client(live.url, live.api_key) as client:
        yield client


def test_configured_from_environment(live: LiveService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CURVPLAN_URL", live.url + "/")
    monkeypatch.setenv("CURVPLAN_API_KEY", live.api_key)
    with curvplan.Client() as client:
        assert client.base_url == live.url
        assert client.health()["status"] in ("ok", "pass", "healthy")
        assert isinstance(client.list_jobs(page_size=1), JobPage)


def test_plan_submit_wait_and_recommendation(api: curvplan.Client) -> None:
    name = f"full-{uuid.uuid4().hex[:8]}"
    job = api.submit_plan(full_measurements(), full_targets(), name=name, tags={"team": "nlp"})
    assert isinstance(job, JobOut)
    assert job.status in ("queued", "running") and job.name == name and job.tags == {"team": "nlp"}
    seen: list[JobOut] = []
    done = api.wait(job.id, timeout=60, on_progress=seen.append, progress_interval=0.2)
    assert done.status == "succeeded", done.error
    assert seen and seen[-1].status == "succeeded"
    assert seen[-1].progress is not None and seen[-1].progress.stage == "done"
    # every callback saw a different (status, progress): no duplicate notifications
    keys = [(j.status, j.progress) for j in seen]
    assert all(a != b for a, b in itertools.pairwise(keys))

    rec = api.get_recommendation(job.id)
    assert isinstance(rec, Recommendation)
    assert rec.model_dump(mode="json") == done.result.recommendation.model_dump(mode="json")  # type: ignore[union-attr]
    assert rec.batch_size.status == "computed"
    assert rec.batch_size.b_crit.value == pytest.approx(500.0, rel=1e-3)  # generated B_crit
    assert api.get_job(job.id).model_dump() == done.model_dump()

    html = api.get_report_html(job.id)
    assert html.startswith("<!DOCTYPE html>") and f"curvplan report — {name}" in html
    assert all(f'id="{pid}"' in html for pid in ("delta-curve", "block-norms", "batch-size"))
    link = api.report_link(job.id)
    assert link.url.startswith(api.base_url) and link.expires_at.timestamp() > time.time()
    assert httpx.get(link.url, timeout=30).text == html  # the same page, without a key


def test_idempotency_key_replays_and_refuses_reuse(api: curvplan.Client) -> None:
    key = f"test-{uuid.uuid4()}"
    body = small_plan(f"idem-{uuid.uuid4().hex[:8]}")
    first = api.submit_job(body, idempotency_key=key)
    again = api.submit_job(body, idempotency_key=key)
    assert again.id == first.id
    other = small_plan("another-name")
    with pytest.raises(ValidationFailedError) as info:
        api.submit_job(other, idempotency_key=key)
    err = info.value
    assert err.status == 422 and err.title == "Idempotency Key Reused"
    assert err.errors and err.errors[0]["field"] == "header.Idempotency-Key"
    assert err.extra["job_id"] == str(first.id)


def test_list_filters_and_pages(api: curvplan.Client) -> None:
    name = f"list-{uuid.uuid4().hex[:8]}"
    ids = {api.submit_job(small_plan(name, {"run": str(i % 2)})).id for i in range(3)}
    page = api.list_jobs(name=name, page_size=2)
    assert len(page.items) == 2 and page.next_page_token
    assert {j.id for j in api.iter_jobs(name=name, page_size=1)} == ids
    odd = list(api.iter_jobs(name=name, tags={"run": "1"}))
    assert len(odd) == 1 and odd[0].tags == {"run": "1"}
    for job_id in ids:
        assert api.wait(job_id, timeout=60).status == "succeeded"
    assert len(api.list_jobs(name=name, status="succeeded").items) == 3
    assert api.list_jobs(name=name, status=["queued", "running"]).items == []


def test_errors_carry_problem_fields(api: curvplan.Client, live: LiveService) -> None:
    missing = uuid.uuid4()
    with pytest.raises(NotFoundError) as nf:
        api.get_job(missing)
    assert nf.value.status == 404 and nf.value.title == "Not Found"
    assert nf.value.detail == "job not found" and nf.value.type
    assert nf.value.instance == f"/v1/jobs/{missing}"

    bad = {"per_sample_losses": [0.5, -1.0]}
    with pytest.raises(ValidationFailedError) as invalid:
        api.submit_plan(bad)
    fields = [e["field"] for e in invalid.value.errors or []]
    assert any(f.startswith("body.measurements.per_sample_losses") for f in fields), fields
    assert "per_sample_losses" in str(invalid.value)

    with pytest.raises(ValidationFailedError) as bad_list:
        api.list_jobs(status="sleeping")
    assert bad_list.value.errors[0]["field"] == "query.status"  # type: ignore[index]

    with curvplan.Client(live.url, "not-a-key") as stranger, pytest.raises(AuthenticationError):
        stranger.list_jobs()

    with pytest.raises(ValueError, match="job_id must be a UUID"):
        api.get_job("../healthz")


def test_cancel_running_job_and_409s(api: curvplan.Client) -> None:
    job = api.submit_job(slow_plan(f"cancel-{uuid.uuid4().hex[:8]}"))
    with pytest.raises(ConflictError) as early:
        api.get_recommendation(job.id)
    assert early.value.status == 409 and early.value.extra["job_status"] in ("queued", "running")
    running = _wait_for_status(api, job.id, "running")
    assert running.status == "running"
    cancelled = api.cancel_job(job.id)
    assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancel_requested
    final = api.wait(job.id, timeout=60)
    assert final.status == "cancelled"
    with pytest.raises(ConflictError) as again:
        api.cancel_job(job.id)
    assert again.value.extra["job_status"] == "cancelled"
    assert "only queued or running jobs can be cancelled" in (again.value.detail or "")


def test_wait_timeout_returns_the_last_job(api: curvplan.Client, live: LiveService) -> None:
    with live.worker.paused():  # the job stays queued
        job = api.submit_job(small_plan(f"timeout-{uuid.uuid4().hex[:8]}"))
        started = time.monotonic()
        with pytest.raises(WaitTimeoutError) as info:
            api.wait(job.id, timeout=1.0)
        assert 0.9 <= time.monotonic() - started < 10
        assert info.value.job is not None and info.value.job.id == job.id
        assert info.value.job.status == "queued"
        assert api.cancel_job(job.id).status == "cancelled"  # queued → cancelled at once


class _CountingTransport(httpx.HTTPTransport):
    """A real transport that counts the connection failures the client had to ride out."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return super().handle_request(request)
        except httpx.TransportError as exc:
            self.failures.append(type(exc).__name__)
            raise


def test_wait_survives_server_restart(live: LiveService) -> None:
    """Kill the API process (SIGKILL) during a long-poll, restart it: wait() still returns."""
    server = live.server  # restarted on the same port, so later tests find it again
    transport = _CountingTransport()
    policy = RetryPolicy(backoff_initial=0.1, backoff_max=0.5, outage_seconds=60)
    client = curvplan.Client(server.url, live.api_key, retry=policy, transport=transport)
    outcome: dict[str, Any] = {}

    def waiter(job_id: uuid.UUID) -> None:
        try:
            outcome["job"] = client.wait(job_id, timeout=120)
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    try:
        with live.worker.paused():  # the job stays queued until the server is back
            job = client.submit_job(small_plan(f"restart-{uuid.uuid4().hex[:8]}"))
            thread = threading.Thread(target=waiter, args=(job.id,))
            thread.start()
            time.sleep(0.5)  # the long-poll request is in flight now
            server.kill()
            time.sleep(1.0)  # down: every retry meets a refused connection
            assert thread.is_alive(), outcome
            server.start()
        thread.join(90)  # the worker runs the job; the re-established long-poll sees it end
        assert not thread.is_alive()
        assert "error" not in outcome, outcome.get("error")
        assert outcome["job"].status == "succeeded" and outcome["job"].id == job.id
        assert "ConnectError" in transport.failures  # it really met the dead server
    finally:
        client.close()
        if server.proc is None or server.proc.poll() is not None:
            server.start()


def test_unreachable_server_raises_after_retries() -> None:
    port = __import__("live_plugin").free_port()
    policy = RetryPolicy(max_retries=2, backoff_initial=0.01, backoff_max=0.02)
    started = time.monotonic()
    with (
        curvplan.Client(f"http://127.0.0.1:{port}", "k", retry=policy) as client,
        pytest.raises(ConnectionFailedError, match="could not reach"),
    ):
        client.list_jobs()
    assert time.monotonic() - started < 5


def test_async_client(live: LiveService, tmp_path: Any) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    data_file = tmp_path / "data.safetensors"
    tokens = np.arange(12 * 7, dtype=np.int64).reshape(12, 7) % 11
    save_file({"inputs": tokens[:, :-1].copy(), "targets": tokens[:, 1:].copy()}, data_file)

    async def scenario() -> None:
        async with curvplan.AsyncClient(live.url, live.api_key) as api:
            uploaded = await api.upload_artifact(data_file, "dataset")
            assert uploaded.sha256 == hashlib.sha256(data_file.read_bytes()).hexdigest()
            assert (await api.get_artifact(uploaded.id)).tensors["inputs"].shape == [12, 6]  # type: ignore[index]
            name = f"async-{uuid.uuid4().hex[:8]}"
            job = await api.submit_plan(full_measurements(), full_targets(), name=name)
            seen: list[str] = []

            async def on_progress(j: JobOut) -> None:
                seen.append(j.status)

            done = await api.wait(job.id, timeout=60, on_progress=on_progress)
            assert done.status == "succeeded" and seen[-1] == "succeeded"
            rec = await api.get_recommendation(job.id)
            assert rec.model_dump(mode="json") == done.result.recommendation.model_dump(mode="json")  # type: ignore[union-attr]
            assert [j.id async for j in api.iter_jobs(name=name)] == [job.id]
            assert (await api.get_job(job.id)).status == "succeeded"
            with pytest.raises(ConflictError):
                await api.cancel_job(job.id)
            with pytest.raises(NotFoundError):
                await api.get_recommendation(uuid.uuid4())

    asyncio.run(scenario())


def _wait_for_status(api: curvplan.Client, job_id: Any, status: str, timeout: float = 60) -> JobOut:
    deadline = time.monotonic() + timeout
    while True:
        job = api.get_job(job_id)
        if job.status == status or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def test_artifacts_and_analyze(api: curvplan.Client, tmp_path: Any) -> None:
    files = write_analyze_files(tmp_path)
    ckpt = api.upload_artifact(files["checkpoint"], "checkpoint")
    data = api.upload_artifact(str(files["data"]), "dataset")
    assert ckpt.kind == "checkpoint" and data.kind == "dataset"
    assert ckpt.sha256 == hashlib.sha256(files["checkpoint"].read_bytes()).hexdigest()
    assert ckpt.size == files["checkpoint"].stat().st_size
    assert api.get_artifact(ckpt.id) == ckpt
    assert api.upload_artifact(files["checkpoint"], "checkpoint").id == ckpt.id  # content-addressed
    with pytest.raises(ValidationFailedError) as wrong_kind:
        api.upload_artifact(files["spec"], "checkpoint")  # JSON is not safetensors
    assert wrong_kind.value.status == 422
    assert wrong_kind.value.errors[0]["field"].startswith("body.file")  # type: ignore[index]
    with pytest.raises(ValueError, match="artifact kind"):
        api.upload_artifact(files["data"], "weights")

    job = api.submit_analyze(SPEC, ckpt, data, name="tiny", options=OPTIONS, targets=TARGETS)
    stages: list[str] = []
    done = api.wait(
        job.id,
        timeout=240,
        progress_interval=0.2,
        on_progress=lambda j: stages.append(j.progress.stage if j.progress else ""),
    )
    assert done.status == "succeeded", done.error
    assert stages  # the long-poll reported progress while it waited
    # Every stage change is kept in the job's progress history, however fast the job ran.
    history = [mark.stage for mark in (done.progress.stages if done.progress else None) or []]
    assert history[0] == "loading" and history[-1] == "planning", history
    assert any(stage.startswith("block spectra") for stage in history), history
    assert {"per-sample losses", "off-diagonal", "bounds"} <= set(history)
    rec = api.get_recommendation(job.id)
    assert rec.curvature.status == "computed"
    names = {b.name for b in rec.curvature.blocks}
    assert {"layers.0.q", "layers.0.k", "layers.0.v"} <= names
    assert isinstance(done.result, AnalyzeResult)
    off = done.result.measurements.off_diagonal or []
    assert {(o.row, o.col) for o in off} == {
        ("layers.0.q", "layers.0.k"),
        ("layers.0.k", "layers.0.v"),
    }

    # the report draws the real analyze result: block heatmap, off-diagonal map, bounds
    plots = {p.id: p for p in api.list_plots(done.id).plots}
    assert plots["block-norms"].files is not None and plots["off-diagonal"].files is not None
    assert plots["off-diagonal"].numbers["blocks"] == ["layers.0.q", "layers.0.k", "layers.0.v"]
    assert plots["bounds"].files is not None or "bound" in (plots["bounds"].empty_reason or "")
    assert api.get_plot(done.id, "off-diagonal", "png").startswith(b"\x89PNG")
    measured = {b.name: b.spectral_norm for b in done.result.measurements.blocks or []}
    assert plots["bounds"].numbers["measured"] == list(measured.values())

    bad = api.upload_artifact(files["wider"], "checkpoint")
    failed = api.wait(api.submit_analyze(SPEC, bad, data, options=OPTIONS).id, timeout=120)
    assert failed.status == "failed" and failed.error is not None
    assert "checkpoint" in (failed.error.detail or "")


def test_latest_recommendation_by_name(api: curvplan.Client) -> None:
    name = f"rec-{uuid.uuid4().hex[:8]}"
    first = api.submit_plan(full_measurements(seed=1), full_targets(), name=name,
                            tags={"run": "a"})  # fmt: skip
    assert api.wait(first.id, timeout=60).status == "succeeded"
    second = api.submit_plan(full_measurements(seed=2), full_targets(), name=name,
                             tags={"run": "b"})  # fmt: skip
    assert api.wait(second.id, timeout=60).status == "succeeded"

    latest = api.latest_recommendation(name)
    assert latest.job_id == second.id and latest.name == name and latest.tags == {"run": "b"}
    assert latest.recommendation == api.get_recommendation(second.id)
    assert isinstance(latest.recommendation, Recommendation)
    assert api.latest_recommendation(name, tags={"run": "a"}).job_id == first.id
    assert [e.job_id for e in api.list_recommendations(name)] == [second.id]
    with pytest.raises(NotFoundError, match="no succeeded job named"):
        api.latest_recommendation(f"{name}-nobody")
