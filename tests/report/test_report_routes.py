"""GET /v1/jobs/{id}/report and POST /v1/jobs/{id}/report-link on the real app and database."""

from __future__ import annotations

import time
import uuid
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import select, update

from curvplan.types.jobs import CLIENT_JOB_CREATE_ADAPTER
from curvplan_core.credentials.keys import lookup_key
from curvplan_core.jobs.models import Job
from curvplan_server.jobs import service
from curvplan_server.reports import signing

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def undrawn_job(db_session: Any, api_key: str, plan_job: dict[str, Any]) -> str:
    """A succeeded plan job of the api_key's project, with the plan_job fixture's result."""
    project_id = lookup_key(db_session, api_key).project_id  # type: ignore[union-attr]
    body = {**plan_job["request"], "name": '<script>alert("x")</script>', "tags": {"t": "a&b"}}
    model = CLIENT_JOB_CREATE_ADAPTER.validate_python(body)
    created = service.create_job(db_session, project_id, model, default_max_attempts=3)
    job_id = str(created.job.id)
    db_session.execute(
        update(Job.__table__)
        .where(Job.__table__.c.id == uuid.UUID(job_id))
        .values(status="succeeded", result=plan_job["result"])
    )
    db_session.commit()
    return job_id


@pytest.fixture
def finished_job(db_session: Any, undrawn_job: str, plan_plots: list[Any]) -> str:
    """``undrawn_job`` with its figures already kept (drawn once per session, for speed)."""
    from curvplan_server.reports.cache import store_plots

    store_plots(db_session, uuid.UUID(undrawn_job), plan_plots)
    db_session.commit()
    return undrawn_job


def test_report_with_bearer_key(
    client: Any, auth_headers: dict[str, str], finished_job: str
) -> None:
    response = client.get(f"/v1/jobs/{finished_job}/report", headers=auth_headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp
    assert response.headers["cache-control"] == "private, no-store"
    html = response.text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html and "<script" not in html
    assert "t=a&amp;b" in html
    for pid in ("delta-curve", "block-norms", "batch-size", "loss-vs-data"):
        assert f'id="{pid}"' in html


def test_report_needs_a_key_or_a_link(
    client: Any, other_auth_headers: dict[str, str], finished_job: str
) -> None:
    anonymous = client.get(f"/v1/jobs/{finished_job}/report")
    assert anonymous.status_code == 401
    assert anonymous.headers["content-type"].startswith("application/problem+json")
    stranger = client.get(f"/v1/jobs/{finished_job}/report", headers=other_auth_headers)
    assert stranger.status_code == 404  # another project's job does not exist for it


def test_signed_link_opens_the_report_without_a_key(
    client: Any,
    auth_headers: dict[str, str],
    other_auth_headers: dict[str, str],
    finished_job: str,
    settings: Any,
) -> None:
    made = client.post(f"/v1/jobs/{finished_job}/report-link", headers=auth_headers)
    assert made.status_code == 200
    link = made.json()
    assert link["url"].endswith(link["path"]) and link["url"].startswith("http")
    lifetime = (
        __import__("datetime").datetime.fromisoformat(link["expires_at"]).timestamp() - time.time()
    )
    assert 0 < lifetime <= settings.report_link_seconds + 1
    page = client.get(link["path"])
    assert page.status_code == 200 and 'id="delta-curve"' in page.text

    query = parse_qs(urlsplit(link["path"]).query)
    expires, token = query["expires"][0], query["token"][0]
    tampered = token[:-2] + ("AA" if token[-2:] != "AA" else "BB")
    bad = client.get(f"/v1/jobs/{finished_job}/report?expires={expires}&token={tampered}")
    assert bad.status_code == 401 and "signature" in bad.json()["detail"]
    longer = client.get(
        f"/v1/jobs/{finished_job}/report?expires={int(expires) + 3600}&token={token}"
    )
    assert longer.status_code == 401  # the expiry is signed: it cannot be extended
    other_job = uuid.uuid4()
    moved = client.get(f"/v1/jobs/{other_job}/report?expires={expires}&token={token}")
    assert moved.status_code == 401  # the token opens that one job only
    half = client.get(f"/v1/jobs/{finished_job}/report?token={token}")
    assert half.status_code == 401

    foreign = client.post(f"/v1/jobs/{finished_job}/report-link", headers=other_auth_headers)
    assert foreign.status_code == 404
    assert client.post(f"/v1/jobs/{finished_job}/report-link").status_code == 401


def test_expired_link_is_refused(
    client: Any, db_session: Any, api_key: str, finished_job: str, settings: Any
) -> None:
    project_id = lookup_key(db_session, api_key).project_id  # type: ignore[union-attr]
    past = int(time.time()) - 5
    token = signing.sign(signing.link_secret(settings), uuid.UUID(finished_job), project_id, past)
    response = client.get(f"/v1/jobs/{finished_job}/report?expires={past}&token={token}")
    assert response.status_code == 401 and "expired" in response.json()["detail"]


def test_signing_round_trip_and_secret_file(tmp_path: Any) -> None:
    from curvplan_core.config import Settings

    settings = Settings(data_dir=tmp_path)
    secret = signing.link_secret(settings)
    assert len(secret) == 64 and (tmp_path / "report-link-secret").stat().st_mode & 0o077 == 0
    assert signing.link_secret(Settings(data_dir=tmp_path)) == secret  # reused, not rotated
    job, project = uuid.uuid4(), uuid.uuid4()
    token = signing.sign(secret, job, project, 2_000_000_000)
    assert signing.verify(secret, job, project, 2_000_000_000, token, now=1e9) is None
    assert signing.verify(secret, job, uuid.uuid4(), 2_000_000_000, token, now=1e9)
    assert signing.verify(b"other", job, project, 2_000_000_000, token, now=1e9)
    assert "expired" in (signing.verify(secret, job, project, 2_000_000_000, token, now=3e9) or "")


def _kept(db_session: Any, job_id: str) -> list[tuple[str, Any]]:
    from curvplan_server.reports.models import JobPlot

    t = JobPlot.__table__.c
    rows = db_session.execute(
        select(t.name, t.created_at).where(t.job_id == uuid.UUID(job_id)).order_by(t.position)
    )
    return [tuple(r) for r in rows]


def test_figures_are_drawn_once_and_served_as_svg_and_png(
    client: Any, db_session: Any, auth_headers: dict[str, str], undrawn_job: str
) -> None:
    assert _kept(db_session, undrawn_job) == []
    listing = client.get(f"/v1/jobs/{undrawn_job}/plots", headers=auth_headers)
    assert listing.status_code == 200
    plots = {p["id"]: p for p in listing.json()["plots"]}
    assert list(plots) == ["delta-curve", "block-norms", "off-diagonal", "bounds",
                           "batch-size", "loss-vs-data", "noise-trend"]  # fmt: skip
    kept = _kept(db_session, undrawn_job)
    assert [name for name, _ in kept] == list(plots)

    drawn = plots["batch-size"]
    assert drawn["files"]["png"] == f"/v1/jobs/{undrawn_job}/plots/batch-size.png"
    png = client.get(drawn["files"]["png"], headers=auth_headers)
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG\r\n\x1a\n")
    assert "immutable" in png.headers["cache-control"]
    svg = client.get(drawn["files"]["svg"], headers=auth_headers)
    assert svg.headers["content-type"].startswith("image/svg+xml")
    texts = ["".join(t.itertext()) for t in ET.fromstring(svg.content).iter(f"{SVG}text")]
    assert any(t.startswith("B_crit = ") for t in texts)
    assert _kept(db_session, undrawn_job) == kept  # served from the kept drawing, not redrawn
    page = client.get(f"/v1/jobs/{undrawn_job}/report", headers=auth_headers)
    assert page.status_code == 200 and 'id="batch-size"' in page.text
    assert _kept(db_session, undrawn_job) == kept

    empty = client.get(f"/v1/jobs/{undrawn_job}/plots/bounds.svg", headers=auth_headers)
    assert empty.status_code == 404 and "analyze" in empty.json()["detail"]
    assert plots["bounds"]["files"] is None and plots["bounds"]["empty_reason"]
    unknown = client.get(f"/v1/jobs/{undrawn_job}/plots/nope.png", headers=auth_headers)
    assert unknown.status_code == 404
    gif = client.get(f"/v1/jobs/{undrawn_job}/plots/batch-size.gif", headers=auth_headers)
    assert gif.status_code == 422 and gif.headers["content-type"].startswith(
        "application/problem+json"
    )


def test_figures_need_the_project_and_a_succeeded_job(
    client: Any,
    db_session: Any,
    auth_headers: dict[str, str],
    other_auth_headers: dict[str, str],
    finished_job: str,
) -> None:
    path = f"/v1/jobs/{finished_job}/plots/delta-curve.png"
    assert client.get(path).status_code == 401
    assert client.get(path, headers=other_auth_headers).status_code == 404
    db_session.execute(
        update(Job.__table__)
        .where(Job.__table__.c.id == uuid.UUID(finished_job))
        .values(status="failed")
    )
    db_session.commit()
    refused = client.get(path, headers=auth_headers)
    assert refused.status_code == 409 and "failed" in refused.json()["detail"]
    listing = client.get(f"/v1/jobs/{finished_job}/plots", headers=auth_headers).json()
    assert all(p["files"] is None and "failed" in p["empty_reason"] for p in listing["plots"])
