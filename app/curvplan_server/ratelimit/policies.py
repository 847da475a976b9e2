"""Which requests are limited, and by what: the submissions of a key and of a project, and the
failed authentications of a client address (docs/operations.md#rate-limits)."""

from __future__ import annotations

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from curvplan_core.config import Settings
from curvplan_core.credentials.keys import AuthContext, hash_key
from curvplan_server.problems import Problem
from curvplan_server.ratelimit.limiter import RateLimiter, RatePolicy, Verdict, too_many_requests

SUBMIT_KEY = "submissions-per-key"
SUBMIT_PROJECT = "submissions-per-project"
FAILED_AUTH = "failed-auth-per-address"


def _limiter(request: Request) -> RateLimiter:
    limiter: RateLimiter = request.app.state.rate_limiter
    return limiter


def _address(request: Request) -> str:
    """The client's address (the proxy's X-Forwarded-For when ``forwarded_allow_ips`` trusts
    it: uvicorn puts it here)."""
    return request.client.host if request.client else "unknown"


def _failed_auth_subject(request: Request) -> tuple[str, RatePolicy]:
    settings: Settings = request.app.state.settings
    policy = RatePolicy(
        FAILED_AUTH,
        settings.rate_limit_failed_auth_per_address,
        settings.rate_limit_window_seconds,
    )
    return f"auth:addr:{_address(request)}", policy


def refuse_if_locked_out(request: Request) -> None:
    """429 before a key lookup when this address is known (in this process) to be over its
    failed-authentication limit: a guess made then is not even checked."""
    bucket, _ = _failed_auth_subject(request)
    verdict = _limiter(request).blocked(bucket)
    if verdict is not None:
        raise too_many_requests(verdict, "failed authentications from this address")


async def failed_authentication(request: Request, unauthorized: Problem) -> Problem:
    """Count a failed authentication of the request's address: the 401 to answer, or a 429
    once the address is over its limit."""
    subject = _failed_auth_subject(request)
    verdict = await run_in_threadpool(_limiter(request).hit, request.app.state.engine, [subject])
    if verdict is not None and not verdict.allowed:
        return too_many_requests(verdict, "failed authentications from this address")
    return unauthorized


async def count_submission(request: Request, auth: AuthContext) -> Verdict | None:
    """Count one job submission against its key's and its project's limits; 429 when either is
    spent (counted in neither). The verdict's headers go on the accepted answer."""
    settings: Settings = request.app.state.settings
    window = settings.rate_limit_window_seconds
    subjects = [
        (
            f"submit:project:{auth.project_id}",
            RatePolicy(SUBMIT_PROJECT, settings.rate_limit_submissions_per_project, window),
        )
    ]
    _, _, key = request.headers.get("authorization", "").partition(" ")
    if key.strip():
        subjects.insert(
            0,
            (
                f"submit:key:{hash_key(key.strip())[:32]}",
                RatePolicy(SUBMIT_KEY, settings.rate_limit_submissions_per_key, window),
            ),
        )
    limiter = _limiter(request)
    remembered = next((v for b, _ in subjects if (v := limiter.blocked(b)) is not None), None)
    verdict = remembered or await run_in_threadpool(limiter.hit, request.app.state.engine, subjects)
    if verdict is not None and not verdict.allowed:
        raise too_many_requests(verdict, "job submissions")
    return verdict
