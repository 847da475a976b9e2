"""The Host header is not trusted: with CURVPLAN_PUBLIC_URL every absolute URL starts with
it; without it, only hosts on CURVPLAN_ALLOWED_HOSTS are answered.

A trailing-slash redirect answered ``Location: http://evil.example/…`` and the report link
was built from ``Host`` and ``X-Forwarded-Proto``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient


def _client(settings: Any, db_session: Any, **update: Any) -> Iterator[TestClient]:
    from curvplan_server.db import get_db
    from curvplan_server.main import create_app

    application = create_app(settings.model_copy(update=update))

    async def bound_session() -> Any:
        yield db_session
        db_session.commit()

    application.dependency_overrides[get_db] = bound_session
    with TestClient(application, follow_redirects=False) as client:
        yield client
    application.state.engine.dispose()


@pytest.fixture
def public_client(settings: Any, db_session: Any) -> Iterator[TestClient]:
    yield from _client(settings, db_session, public_url="https://curvplan.example.com/")


@pytest.fixture
def listed_client(settings: Any, db_session: Any) -> Iterator[TestClient]:
    yield from _client(
        settings, db_session, public_url=None, allowed_hosts=["api.internal", "*.example.org"]
    )


EVIL = {"Host": "evil.example", "X-Forwarded-Proto": "gopher", "X-Forwarded-Host": "evil.example"}


def test_public_url_builds_the_redirect_and_the_report_link(
    public_client: TestClient, auth_headers: dict[str, str]
) -> None:
    redirect = public_client.get("/v1/jobs/", headers={**auth_headers, **EVIL})
    assert redirect.status_code in (307, 308), redirect.text
    assert redirect.headers["location"] == "https://curvplan.example.com/v1/jobs"
    body = {"kind": "plan", "measurements": {"per_sample_losses": [0.5, 0.6], "loss_bound": 1}}
    job = public_client.post("/v1/jobs", json=body, headers=auth_headers).json()
    link = public_client.post(
        f"/v1/jobs/{job['id']}/report-link", headers={**auth_headers, **EVIL}
    ).json()
    assert link["url"].startswith(f"https://curvplan.example.com/v1/jobs/{job['id']}/report?")


def test_without_public_url_only_listed_hosts_are_answered(
    listed_client: TestClient, auth_headers: dict[str, str]
) -> None:
    refused = listed_client.get("/v1/jobs/", headers={**auth_headers, **EVIL})
    assert refused.status_code == 400
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert "evil.example" in refused.json()["detail"] and "location" not in refused.headers
    ok = listed_client.get("/v1/jobs/", headers={**auth_headers, "Host": "api.internal"})
    assert ok.status_code in (307, 308)
    assert ok.headers["location"] == "http://api.internal/v1/jobs"
    sub = listed_client.get("/v1/jobs", headers={**auth_headers, "Host": "a.example.org:8000"})
    assert sub.status_code == 200


def test_the_default_allow_list_is_loopback_only() -> None:
    from curvplan_core.config import Settings

    defaults = Settings.model_fields["allowed_hosts"].default_factory()  # type: ignore[misc, call-arg]
    assert defaults == ["localhost", "127.0.0.1"]
    no_proxies = Settings.model_fields["forwarded_allow_ips"].default_factory  # type: ignore[misc]
    assert no_proxies() == []  # type: ignore[call-arg]
