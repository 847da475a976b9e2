"""Retry and error-mapping rules of the client, on scripted transports (no server needed)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import httpx
import pytest

import curvplan
from curvplan.client import (
    ConnectionFailedError,
    CurvplanError,
    RetryPolicy,
    ServerError,
    ServiceUnavailableError,
)
from curvplan.client.errors import error_from_problem

FAST = RetryPolicy(max_retries=3, backoff_initial=0.001, backoff_max=0.01)
PAGE = {"items": [], "next_page_token": None}


def _client(handler: Callable[[httpx.Request], httpx.Response]) -> curvplan.Client:
    return curvplan.Client(
        "http://api.test", "key", retry=FAST, transport=httpx.MockTransport(handler)
    )


def test_503_is_retried_then_succeeds() -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503, json={"title": "Service Unavailable", "status": 503})
        return httpx.Response(200, json=PAGE)

    with _client(handler) as client:
        assert client.list_jobs().items == []
    assert len(calls) == 3
    assert calls[0].headers["authorization"] == "Bearer key"


def test_503_after_every_retry_raises_with_problem_fields() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {
            "type": "https://x/busy",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "draining",
        }
        return httpx.Response(503, json=body, headers={"content-type": "application/problem+json"})

    with _client(handler) as client, pytest.raises(ServiceUnavailableError) as info:
        client.list_jobs()
    assert isinstance(info.value, ServerError)
    assert (info.value.status, info.value.detail, info.value.type) == (
        503,
        "draining",
        "https://x/busy",
    )


def test_retry_after_header_is_honoured_within_the_cap() -> None:
    assert RetryPolicy(backoff_max=5).delay(0, retry_after=2.0) == 2.0
    assert RetryPolicy(backoff_max=5).delay(0, retry_after=60.0) == 5.0
    delays = [RetryPolicy(jitter=0).delay(n) for n in range(8)]
    assert delays[:4] == [0.25, 0.5, 1.0, 2.0] and max(delays) == 8.0


def test_connect_errors_are_retried_for_any_call() -> None:
    attempts = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request.url.path)
        if len(attempts) == 1:
            raise httpx.ConnectError("refused", request=request)
        body = {"title": "Not Found", "status": 404, "detail": "job not found"}
        return httpx.Response(404, json=body)

    with _client(handler) as client, pytest.raises(curvplan.NotFoundError):
        client.cancel_job(uuid.uuid4())  # POST, but the first try never reached the server
    assert len(attempts) == 2


def test_broken_connection_is_not_resent_for_a_non_idempotent_call() -> None:
    attempts = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request.method)
        raise httpx.ReadError("reset", request=request)

    with _client(handler) as client, pytest.raises(ConnectionFailedError):
        client.cancel_job(uuid.uuid4())
    assert attempts == ["POST"]  # it may have arrived: no blind resend
    attempts.clear()
    with _client(handler) as client, pytest.raises(ConnectionFailedError):
        client.list_jobs()
    assert attempts == ["GET"] * 4  # idempotent: 1 + max_retries


def test_job_submission_is_resent_with_the_same_idempotency_key() -> None:
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        if len(keys) == 1:
            raise httpx.RemoteProtocolError("server went away", request=request)
        return httpx.Response(503)

    with _client(handler) as client, pytest.raises(ServiceUnavailableError):
        client.submit_plan({"per_sample_losses": [1.0]})
    assert len(keys) == 4 and len(set(keys)) == 1  # one key: the server dedupes resends


def test_non_problem_error_body_still_maps_by_status() -> None:
    err = error_from_problem(502, None, "<html>bad gateway</html>")
    assert isinstance(err, ServerError) and err.status == 502 and err.title == "Bad Gateway"
    assert "bad gateway" in str(err)
    generic = error_from_problem(418, {"title": "Teapot", "status": 418, "errors": "nope"})
    assert type(generic) is CurvplanError and generic.errors is None


def test_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        curvplan.Client("ftp://example.org")


def test_client_cli_and_report_code_never_import_torch() -> None:
    """Nor does the client draw: it downloads the service's figures (no matplotlib), and
    the API loads matplotlib on the first report, not at start."""
    code = (
        "import sys, curvplan, curvplan.cli; curvplan.Client; curvplan.AsyncClient; "
        "import curvplan.commands.client, curvplan.client.display, curvplan.report_files; "
        "assert 'matplotlib' not in sys.modules, 'the client imported matplotlib'; "
        "assert 'curvplan_server' not in sys.modules, 'the client imported the server'; "
        "assert 'curvplan_core' not in sys.modules, 'the client imported the core'; "
        "import curvplan_server.reports.router; "
        "import curvplan_server.main; "
        "assert 'matplotlib' not in sys.modules, 'the API start imported matplotlib'; "
        "import curvplan_server.reports.cache; "
        "assert 'torch' not in sys.modules, 'torch was imported'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_gateway_errors_are_retried_only_for_idempotent_calls() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if request.method == "GET" and len(calls) < 2:
            return httpx.Response(502, text="<html>bad gateway</html>")
        if request.method == "POST":
            return httpx.Response(504, text="gateway timeout")
        return httpx.Response(200, json=PAGE)

    with _client(handler) as client:
        assert client.list_jobs().items == []
        assert calls == ["GET", "GET"]
        calls.clear()
        with pytest.raises(ServerError) as info:
            client.cancel_job(uuid.uuid4())
        assert calls == ["POST"] and info.value.status == 504


def _job(job_id: str, status: str) -> dict[str, object]:
    now = "2026-11-30T08:00:00+00:00"
    base = f"/v1/jobs/{job_id}"
    return {
        "id": job_id, "kind": "plan", "queue": "cpu", "status": status, "name": None,
        "tags": {}, "progress": None, "attempt": 1, "max_attempts": 3,
        "cancel_requested": False, "result": None, "error": None, "created_at": now,
        "updated_at": now, "started_at": None, "finished_at": None,
        "links": {"self": base, "cancel": f"{base}/cancel",
                  "recommendation": f"{base}/recommendation"},
    }  # fmt: skip


def test_wait_rides_out_503s_and_refused_connections() -> None:
    job_id = str(uuid.uuid4())
    script = ["running", "503", "refused", "503", "succeeded"]
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        step = script[len(seen)]
        seen.append(step)
        assert request.url.params["wait"]  # every poll is a long-poll
        if step == "refused":
            raise httpx.ConnectError("refused", request=request)
        if step == "503":
            return httpx.Response(503, json={"title": "Service Unavailable", "status": 503})
        return httpx.Response(200, json=_job(job_id, step))

    statuses: list[str] = []
    with _client(handler) as client:
        job = client.wait(job_id, timeout=30, on_progress=lambda j: statuses.append(j.status))
    assert job.status == "succeeded" and seen == script
    assert statuses == ["running", "succeeded"]


def test_wait_gives_up_after_the_outage_budget() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    policy = RetryPolicy(backoff_initial=0.01, backoff_max=0.02, outage_seconds=0.2)
    transport = httpx.MockTransport(handler)
    started = time.monotonic()
    with (
        curvplan.Client("http://api.test", "k", retry=policy, transport=transport) as client,
        pytest.raises(ConnectionFailedError),
    ):
        client.wait(uuid.uuid4())
    assert 0.2 <= time.monotonic() - started < 5


def test_wait_deadline_during_an_outage_is_a_timeout() -> None:
    job_id = str(uuid.uuid4())
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(200, json=_job(job_id, "running"))
        raise httpx.ConnectError("refused", request=request)

    policy = RetryPolicy(backoff_initial=0.05, backoff_max=0.05, outage_seconds=60)
    transport = httpx.MockTransport(handler)
    with (
        curvplan.Client("http://api.test", "k", retry=policy, transport=transport) as client,
        pytest.raises(curvplan.WaitTimeoutError) as info,
    ):
        client.wait(job_id, timeout=0.3)
    assert info.value.job is not None and info.value.job.status == "running"
    assert isinstance(info.value.__cause__, ConnectionFailedError)


def test_429_waits_the_full_retry_after_past_backoff_max(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rate limit's Retry-After is honoured in full (FAST caps backoff at 0.01 s), and a 429
    is resent even for a submission (not idempotent: the server did not handle it)."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "7"}, json={"status": 429})
        return httpx.Response(202, json={"id": str(uuid.uuid4())})

    with _client(handler) as client:
        client._send(curvplan.client._common.Call("POST", "/v1/jobs", idempotent=False))
    assert len(calls) == 2 and slept == [7.0]


def test_429_with_a_wait_past_the_bound_raises_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from curvplan.client import RateLimitedError

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "3600"}, json={"status": 429})

    with _client(handler) as client, pytest.raises(RateLimitedError):
        client.list_jobs()
    assert slept == []


def test_an_error_carries_the_answers_request_id() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"title": "Not Found", "status": 404, "detail": "no such job"}
        return httpx.Response(404, json=body, headers={"X-Request-ID": "abc123"})

    with _client(handler) as client, pytest.raises(CurvplanError) as info:
        client.get_job(uuid.uuid4())
    assert info.value.request_id == "abc123" and info.value.status == 404
