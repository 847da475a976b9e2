"""Webhooks: the outbox trigger, the signed POSTs to a real receiver on 127.0.0.1, retries,
redirects, the address policy at each delivery, the API, and the client's verification."""

from __future__ import annotations

import ipaddress
import json
import time
import uuid
from typing import Any

import pytest
from plan_bodies import full_measurements, full_targets
from receiver import Receiver
from sqlalchemy import text
from sqlalchemy.orm import Session

from curvplan.headline import headline_dict
from curvplan.types.jobs import PlanJobCreate
from curvplan.webhooks import (
    WebhookVerificationError,
    WebhookVerifier,
    signature_headers,
    verify,
)
from curvplan_core.credentials.keys import create_key, lookup_key
from curvplan_core.webhooks.guard import AddressPolicy, WebhookRefused, host_allowed
from curvplan_server.jobs import service
from curvplan_server.webhooks.service import list_deliveries, new_secret, rotate_secret
from curvplan_worker.webhooks import SenderOptions, deliver_due

LOOPBACK = AddressPolicy.from_lists(["127.0.0.1", "localhost"], ["127.0.0.0/8"])
FAST = SenderOptions(policy=LOOPBACK, max_attempts=4, backoff_seconds=0.05, timeout_seconds=5)


# --------------------------------------------------------------------------- helpers
def _project(engine: Any) -> tuple[uuid.UUID, str]:
    """A committed project with a signing secret: (project id, secret)."""
    with Session(engine) as session:
        key = create_key(session, f"hooks-{uuid.uuid4().hex[:8]}")
        session.commit()
        project_id = lookup_key(session, key).project_id  # type: ignore[union-attr]
        secret = rotate_secret(session, project_id).secret
    return project_id, secret


def _job(engine: Any, project_id: uuid.UUID, url: str | None, parent: uuid.UUID | None = None
         ) -> uuid.UUID:  # fmt: skip
    body: dict[str, Any] = {"kind": "plan", "measurements": {"loss_bound": 1.0}, "name": "hooked"}
    if url is not None:
        body["webhook_url"] = url
    with Session(engine) as session:
        model = PlanJobCreate.model_validate(body)
        job = service.create_job(session, project_id, model, default_max_attempts=3).job
        if parent is not None:
            session.execute(text("UPDATE job SET parent_id = :p WHERE id = :j"),
                            {"p": parent, "j": job.id})  # fmt: skip
        session.commit()
    return job.id


def _set_status(engine: Any, job_id: uuid.UUID, status: str, *, commit: bool = True) -> None:
    with engine.connect() as conn:
        conn.execute(
            text("UPDATE job SET status = :s, finished_at = now() WHERE id = :j"),
            {"s": status, "j": job_id},
        )
        if commit:
            conn.commit()
        else:
            conn.rollback()


def _deliveries(engine: Any, job_id: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(text("SELECT * FROM webhook_delivery WHERE job_id = :j"), {"j": job_id})
        )


def _drain(engine: Any, options: SenderOptions, *jobs: uuid.UUID, until: float = 10.0) -> None:
    """Run the sender until the jobs' deliveries are settled (or ``until`` seconds)."""
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        deliver_due(engine, options)
        with engine.connect() as conn:
            pending = conn.execute(
                text(
                    "SELECT count(*) FROM webhook_delivery WHERE status = 'pending' "
                    "AND job_id = ANY(:jobs)"
                ),
                {"jobs": list(jobs)},
            ).scalar_one()
        if not pending:
            return
        time.sleep(0.05)


# --------------------------------------------------------------------------- verification
def test_verify_accepts_the_signed_event_and_rejects_tampering_and_replays() -> None:
    secret = new_secret()
    event_id = str(uuid.uuid4())
    event = {
        "id": event_id,
        "type": "job.succeeded",
        "created_at": "2026-11-30T20:00:00+00:00",
        "job": {"id": str(uuid.uuid4()), "kind": "plan", "name": "x", "status": "succeeded"},
        "links": {"job": "/j", "recommendation": "/r", "report": "/p"},
    }
    body = json.dumps(event).encode()
    headers = signature_headers([secret], event_id, body, timestamp=1_000_000)
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-signature"].startswith("v1,")
    assert verify(body, headers, secret, now=1_000_010).id == event_id

    tampered = body.replace(b"succeeded", b"failed\x20\x20\x20")
    other_id = {**headers, "webhook-id": str(uuid.uuid4())}
    later = {**headers, "webhook-timestamp": "1000001"}
    bad_cases = [
        (tampered, headers, secret, 1_000_010, "does not match"),
        (body, later, secret, 1_000_010, "does not match"),
        (body, other_id, secret, 1_000_010, "does not match"),
        (body, headers, new_secret(), 1_000_010, "does not match"),
        (body, headers, secret, 1_000_000 + 301, "old"),  # a captured request, replayed later
        (body, {**headers, "webhook-signature": "abc"}, secret, 1_000_010, "malformed"),
        (body, {"webhook-id": event_id}, secret, 1_000_010, "no webhook-timestamp"),
    ]
    for data, head, key, now, match in bad_cases:
        with pytest.raises(WebhookVerificationError, match=match):
            verify(data, head, key, now=now)

    verifier = WebhookVerifier(secret)
    assert verifier.verify(body, headers, now=1_000_010).job.kind == "plan"
    with pytest.raises(WebhookVerificationError, match="already received"):
        verifier.verify(body, headers, now=1_000_020)  # replayed within the tolerance
    # a rotation window: two space-separated v1 entries, either secret verifies
    old = new_secret()
    both = signature_headers([secret, old], event_id, body, timestamp=1_000_000)
    assert len(both["webhook-signature"].split(" ")) == 2
    for key in (secret, old):
        assert verify(body, both, key, now=1_000_010).id == event_id


def test_signatures_are_standard_webhooks_as_the_reference_library_reads_them() -> None:
    """The ``standardwebhooks`` package (the spec's reference implementation) accepts what
    curvplan signs, with either secret during a rotation and with none other; and curvplan's
    verifier accepts what the package signs (an independent oracle both ways)."""
    from standardwebhooks import Webhook
    from standardwebhooks import WebhookVerificationError as LibraryError

    new, old, stranger = new_secret(), new_secret(), new_secret()
    event_id = str(uuid.uuid4())
    event = {"id": event_id, "type": "job.failed", "created_at": "2026-12-03T00:00:00Z",
             "job": {"id": "j", "kind": "plan", "status": "failed"},
             "links": {"job": "/j", "recommendation": "/r", "report": "/p"}}  # fmt: skip
    body = json.dumps(event).encode()
    headers = signature_headers([new, old], event_id, body)
    for key in (new, old):
        assert Webhook(key).verify(body, headers)["id"] == event_id
    with pytest.raises(LibraryError):
        Webhook(stranger).verify(body, headers)
    with pytest.raises(LibraryError):
        Webhook(new).verify(body + b" ", headers)
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    theirs = Webhook(new).sign(event_id, now, body.decode())
    ours = {"webhook-id": event_id, "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": theirs}  # fmt: skip
    assert verify(body, ours, new).id == event_id


# --------------------------------------------------------------------------- address policy
@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "127.8.9.10", "169.254.169.254", "10.0.0.1", "192.168.1.1", "172.16.0.5",
     "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1",
     "::ffff:169.254.169.254", "224.0.0.1", "fd00:ec2::254"],
)  # fmt: skip
def test_private_addresses_are_refused_unless_their_network_is_allowed(address: str) -> None:
    ip = ipaddress.ip_address(address)
    with pytest.raises(WebhookRefused):
        AddressPolicy.from_lists(["*"], []).check_address(ip)
    AddressPolicy.from_lists(["*"], ["0.0.0.0/0", "::/0"]).check_address(ip)


@pytest.mark.parametrize(
    ("address", "reaches"),
    [
        ("64:ff9b::7f00:1", "127.0.0.1"),  # NAT64 well-known prefix (RFC 6052)
        ("64:ff9b::a9fe:a9fe", "169.254.169.254"),
        ("64:ff9b::c0a8:101", "192.168.1.1"),
        ("2002:7f00:1::1", "127.0.0.1"),  # 6to4 (RFC 3056)
        ("2002:a00:1::", "10.0.0.1"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1"),  # Teredo client (RFC 4380)
    ],
)
def test_ipv6_translations_of_private_ipv4_are_refused(address: str, reaches: str) -> None:
    ip = ipaddress.ip_address(address)
    with pytest.raises(WebhookRefused, match=f"reaches {reaches}"):
        AddressPolicy.from_lists(["*"], []).check_address(ip)
    with pytest.raises(WebhookRefused, match="loopback"):  # also as a literal in the URL
        AddressPolicy.from_lists(["*"], []).check_url(f"http://[{address}]/hook")
    # the operator allowing the IPv4 network it reaches allows it
    AddressPolicy.from_lists(["*"], [f"{reaches}/32"]).check_address(ip)


def test_local_use_nat64_is_refused_and_public_translations_pass() -> None:
    policy = AddressPolicy.from_lists(["*"], [])
    with pytest.raises(WebhookRefused):  # RFC 8215 local-use: a site's own translator
        policy.check_address(ipaddress.ip_address("64:ff9b:1::7f00:1"))
    for public in ["64:ff9b::5db8:d70e", "2002:5db8:d70e::1"]:  # 93.184.215.14
        policy.check_address(ipaddress.ip_address(public))


def test_public_addresses_pass_and_hosts_follow_the_allow_list() -> None:
    AddressPolicy.from_lists(["*"], []).check_address(ipaddress.ip_address("93.184.215.14"))
    assert host_allowed("hooks.example.com", ["*.example.com"])
    assert host_allowed("HOOKS.Example.com.", ["hooks.example.com"])
    assert not host_allowed("example.com.evil.net", ["*.example.com", "example.com"])
    assert not host_allowed("evilexample.com", ["*.example.com"])
    policy = AddressPolicy.from_lists(["hooks.example.com", "127.0.0.1"], [])
    assert policy.check_url("https://hooks.example.com/x") == ("https", "hooks.example.com", 443)
    for url, match in [
        ("https://other.example.com/", "allow-list"),
        ("ftp://hooks.example.com/", "http"),
        ("https://u:p@hooks.example.com/", "credentials"),
        ("http://127.0.0.1:9/", "loopback"),  # listed host, but a loopback literal
    ]:
        with pytest.raises(WebhookRefused, match=match):
            policy.check_url(url)
    with pytest.raises(WebhookRefused, match="webhooks are off"):
        AddressPolicy().check_url("https://hooks.example.com/")


# --------------------------------------------------------------------------- the outbox
def test_outbox_row_is_written_with_the_terminal_status_and_only_then(engine: Any) -> None:
    project_id, _ = _project(engine)
    job = _job(engine, project_id, "http://127.0.0.1:9/hook")
    _set_status(engine, job, "running")
    assert _deliveries(engine, job) == []
    _set_status(engine, job, "succeeded", commit=False)  # the transaction rolls back ...
    assert _deliveries(engine, job) == []  # ... and its event with it
    _set_status(engine, job, "succeeded")
    (row,) = _deliveries(engine, job)
    assert row.event_type == "job.succeeded" and row.url == "http://127.0.0.1:9/hook"
    assert row.payload["job"] == {"id": str(job), "kind": "plan", "name": "hooked",
                                  "status": "succeeded", "tags": {}}  # fmt: skip
    assert row.payload["links"]["recommendation"] == f"/v1/jobs/{job}/recommendation"
    _set_status(engine, job, "failed")  # terminal → terminal: not a new end of the job
    assert len(_deliveries(engine, job)) == 1

    child = _job(engine, project_id, "http://127.0.0.1:9/hook", parent=job)
    _set_status(engine, child, "failed")
    assert _deliveries(engine, child) == []  # fan-out children do not fire
    silent = _job(engine, project_id, None)
    _set_status(engine, silent, "cancelled")
    assert _deliveries(engine, silent) == []


# --------------------------------------------------------------------------- delivery
def test_signed_post_retried_after_500s_and_never_sent_again(
    engine: Any, receiver: Receiver
) -> None:
    project_id, secret = _project(engine)
    receiver.answers = [500, 503]
    job = _job(engine, project_id, receiver.url + "/hook?src=curvplan")
    _set_status(engine, job, "failed")
    _drain(engine, FAST, job)
    got = receiver.wait_for(3)
    assert len(got) == 3 and {r.path for r in got} == {"/hook?src=curvplan"}
    assert len({r.body for r in got}) == 1  # the same event each time, freshly signed
    for r in got:
        event = verify(r.body, r.headers, secret)
        assert event.id == r.headers["webhook-id"] and event.job.id == str(job)
        assert event.type == "job.failed" and event.job.status == "failed"
    with Session(engine) as session:
        (delivery,) = list_deliveries(session, project_id, job).items
    assert delivery.status == "succeeded" and delivery.delivered_at is not None
    assert [a.status_code for a in delivery.attempts] == [500, 503, 200]
    assert [a.number for a in delivery.attempts] == [1, 2, 3]
    for _ in range(3):  # nothing is sent twice after a success
        deliver_due(engine, FAST)
    with Session(engine) as session:
        (again,) = list_deliveries(session, project_id, job).items
    assert again.status == "succeeded" and len(again.attempts) == 3
    time.sleep(0.2)
    assert len(receiver.requests) == 3
    with Session(engine) as session:
        assert len(list_deliveries(session, project_id, job).items[0].attempts) == 3


def test_a_rotated_secret_keeps_signing_for_the_overlap_only(
    engine: Any, receiver: Receiver
) -> None:
    """After a rotation with an overlap every event carries two signatures (old and new
    secret, space-separated); a rotation without one (or after it ends) signs with the new
    secret alone."""
    from standardwebhooks import Webhook
    from standardwebhooks import WebhookVerificationError as LibraryError

    project_id, first = _project(engine)
    with Session(engine) as session:
        rotated = rotate_secret(session, project_id, overlap_seconds=3600)
    assert rotated.previous_expires_at is not None
    job = _job(engine, project_id, receiver.url + "/overlap")
    _set_status(engine, job, "succeeded")
    _drain(engine, FAST, job)
    (got,) = receiver.wait_for(1)
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    for key in (first, rotated.secret):
        assert Webhook(key).verify(got.body, got.headers)["job"]["id"] == str(job)

    with Session(engine) as session:
        third = rotate_secret(session, project_id, overlap_seconds=0)
    assert third.previous_expires_at is None
    job = _job(engine, project_id, receiver.url + "/after")
    _set_status(engine, job, "succeeded")
    _drain(engine, FAST, job)
    got = receiver.wait_for(2)[1]
    assert len(got.headers["webhook-signature"].split(" ")) == 1
    assert Webhook(third.secret).verify(got.body, got.headers)["job"]["id"] == str(job)
    with pytest.raises(LibraryError):
        Webhook(rotated.secret).verify(got.body, got.headers)


def test_redirects_are_not_followed_and_4xx_not_retried(engine: Any, receiver: Receiver) -> None:
    project_id, _ = _project(engine)
    receiver.answers = [302]
    redirected = _job(engine, project_id, receiver.url + "/a")
    _set_status(engine, redirected, "succeeded")
    _drain(engine, FAST, redirected)
    receiver.answers = [410]
    gone = _job(engine, project_id, receiver.url + "/b")
    _set_status(engine, gone, "succeeded")
    _drain(engine, FAST, gone)
    assert [r.path for r in receiver.requests] == ["/a", "/b"]  # never /redirected
    with Session(engine) as session:
        (a,) = list_deliveries(session, project_id, redirected).items
        (b,) = list_deliveries(session, project_id, gone).items
    assert a.status == "failed" and "redirect" in (a.attempts[0].error or "")
    assert b.status == "failed" and len(b.attempts) == 1 and b.attempts[0].status_code == 410


def test_address_is_checked_at_each_delivery(engine: Any, receiver: Receiver) -> None:
    """A host name on the allow-list that resolves to loopback at delivery time (DNS
    rebinding) is refused when loopback is not allowed, and nothing reaches the receiver."""
    project_id, _ = _project(engine)
    port = receiver.server.server_address[1]
    job = _job(engine, project_id, f"http://localhost:{port}/hook")
    _set_status(engine, job, "succeeded")
    strict = SenderOptions(policy=AddressPolicy.from_lists(["localhost"], []), max_attempts=2,
                           backoff_seconds=0.05)  # fmt: skip
    _drain(engine, strict, job)
    with Session(engine) as session:
        (delivery,) = list_deliveries(session, project_id, job).items
    assert delivery.status == "failed" and len(delivery.attempts) == 2
    assert all("loopback" in (a.error or "") for a in delivery.attempts)
    assert receiver.requests == []


POISON_URL = "http://" + "a" * 300 + ".com/"  # a 300-character label: IDNA cannot encode it


def _due_first(engine: Any, job_id: uuid.UUID) -> None:
    """Put the job's delivery at the head of the claim order (the oldest due)."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE webhook_delivery SET next_attempt_at = now() - interval '1 hour' "
                 "WHERE job_id = :j"), {"j": job_id},
        )  # fmt: skip


def test_a_poisoned_delivery_is_its_own_failed_attempt_and_holds_no_other(
    engine: Any, receiver: Receiver
) -> None:
    """One delivery whose URL the resolver cannot encode, claimed first in a batch with five
    good ones of other projects: the five are sent on that very pass, and the bad one's
    attempt is recorded (not left leased and pending past its maximum)."""
    poisoned_project, _ = _project(engine)
    poisoned = _job(engine, poisoned_project, POISON_URL)
    _set_status(engine, poisoned, "succeeded")
    _due_first(engine, poisoned)
    good = []
    for i in range(5):
        project_id, _ = _project(engine)
        good.append((project_id, _job(engine, project_id, f"{receiver.url}/good/{i}")))
        _set_status(engine, good[-1][1], "succeeded")
    batch = SenderOptions(
        policy=AddressPolicy.from_lists(["*"], ["127.0.0.0/8"]),
        max_attempts=2,
        backoff_seconds=0.05,
        timeout_seconds=5,
        batch=100,
    )
    deliver_due(engine, batch)  # one pass
    assert sorted(r.path for r in receiver.wait_for(5, timeout=5)) == [
        f"/good/{i}" for i in range(5)
    ]
    with Session(engine) as session:
        for project_id, job_id in good:
            (delivery,) = list_deliveries(session, project_id, job_id).items
            assert delivery.status == "succeeded" and len(delivery.attempts) == 1
        (bad,) = list_deliveries(session, poisoned_project, poisoned).items
    assert bad.status == "failed" and len(bad.attempts) == 1  # a bad name is not retried
    assert "DNS name" in (bad.attempts[0].error or "")


class _FaultyPolicy(AddressPolicy):
    """Loopback allowed; connecting to port 1 raises what no handler expects (a bug)."""

    def connect(self, address: tuple[str, int], timeout: float | None = None,
                source_address: tuple[str, int] | None = None) -> Any:  # fmt: skip
        if address[1] == 1:
            raise RuntimeError("unexpected fault in the connection code")
        return super().connect(address, timeout, source_address)


def test_any_exception_counts_toward_the_maximum_attempts(engine: Any, receiver: Receiver) -> None:
    project_id, _ = _project(engine)
    faulty = _job(engine, project_id, "http://127.0.0.1:1/hook")
    _set_status(engine, faulty, "succeeded")
    _due_first(engine, faulty)
    fine = _job(engine, project_id, receiver.url + "/fine")
    _set_status(engine, fine, "succeeded")
    options = SenderOptions(
        policy=_FaultyPolicy(("127.0.0.1",), LOOPBACK.allowed_networks),
        max_attempts=2,
        backoff_seconds=0.05,
        timeout_seconds=5,
        batch=100,
    )
    _drain(engine, options, faulty, fine)
    for _ in range(3):  # never tried past its maximum
        deliver_due(engine, options)
        time.sleep(0.1)
    with Session(engine) as session:
        (bad,) = list_deliveries(session, project_id, faulty).items
        (ok,) = list_deliveries(session, project_id, fine).items
    assert bad.status == "failed" and [a.number for a in bad.attempts] == [1, 2]
    assert all("RuntimeError: unexpected fault" in (a.error or "") for a in bad.attempts)
    assert ok.status == "succeeded" and len(receiver.requests) == 1


def test_a_delivery_left_leased_at_its_maximum_is_failed_not_retried(engine: Any) -> None:
    """A sender that died during the last allowed attempt leaves the row pending and leased;
    once the lease runs out it is failed with that attempt recorded, not sent a third time."""
    project_id, _ = _project(engine)
    job = _job(engine, project_id, "http://127.0.0.1:9/hook")
    _set_status(engine, job, "succeeded")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE webhook_delivery SET attempts = 2, next_attempt_at = now(), "
                 "locked_until = now() - interval '1 second' WHERE job_id = :j"), {"j": job},
        )  # fmt: skip
    deliver_due(engine, SenderOptions(policy=LOOPBACK, max_attempts=2, batch=100))
    with Session(engine) as session:
        (delivery,) = list_deliveries(session, project_id, job).items
    assert delivery.status == "failed"
    assert [a.number for a in delivery.attempts] == [2]
    assert "no outcome was recorded" in (delivery.attempts[0].error or "")


def test_a_slow_receiver_is_cut_off_at_the_time_limit() -> None:
    """A receiver that sends its answer a byte at a time ends the attempt at the limit."""
    import socket
    import threading

    from curvplan_worker.webhooks import post_event

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            if stop.wait(0.5):
                break
            try:
                conn.send(bytes([byte]))
            except OSError:
                break
        conn.close()

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    options = SenderOptions(policy=LOOPBACK, timeout_seconds=1.0)
    t0 = time.monotonic()
    outcome = post_event(f"http://127.0.0.1:{server.getsockname()[1]}/", b"{}", {}, options)
    elapsed = time.monotonic() - t0
    stop.set()
    server.close()
    assert not outcome.ok and outcome.retry and "time limit" in (outcome.error or "")
    assert elapsed < 8.0, elapsed  # 40 bytes at 0.5 s each take 20 s (slack for a loaded CI)


# --------------------------------------------------------------------------- the API
def test_api_secret_submit_checks_and_delivery_listing(
    client: Any, db_session: Any, auth_headers: dict[str, str], engine: Any
) -> None:
    body = {"kind": "plan", "measurements": full_measurements(), "targets": full_targets(),
            "webhook_url": "http://127.0.0.1:9/hook"}  # fmt: skip
    no_secret = client.post("/v1/jobs", json=body, headers=auth_headers)
    assert no_secret.status_code == 422
    assert no_secret.json()["errors"][0]["field"] == "body.webhook_url"
    assert "secret" in no_secret.json()["errors"][0]["message"]

    made = client.post("/v1/webhooks/secret", headers=auth_headers)
    assert made.status_code == 201 and made.json()["secret"].startswith("whsec_")
    again = client.post("/v1/webhooks/secret", headers=auth_headers).json()["secret"]
    assert again != made.json()["secret"]  # rotated
    for url, why in [("http://10.0.0.8/h", "allow-list"), ("http://169.254.169.254/", "allow"),
                     ("file:///etc/passwd", "URL"), (POISON_URL, "DNS name")]:  # fmt: skip
        refused = client.post("/v1/jobs", json={**body, "webhook_url": url}, headers=auth_headers)
        assert refused.status_code == 422, url
        assert refused.json()["errors"][0]["field"] == "body.webhook_url"
        assert why in refused.json()["errors"][0]["message"], refused.json()
    created = client.post("/v1/jobs", json=body, headers=auth_headers)
    assert created.status_code == 202
    job_id = created.json()["id"]
    listing = client.get(f"/v1/jobs/{job_id}/webhooks", headers=auth_headers)
    assert listing.status_code == 200 and listing.json() == {"items": []}
    db_session.execute(text("UPDATE job SET status = 'cancelled' WHERE id = :j"), {"j": job_id})
    db_session.commit()
    (item,) = client.get(f"/v1/jobs/{job_id}/webhooks", headers=auth_headers).json()["items"]
    assert item["status"] == "pending" and item["event_type"] == "job.cancelled"
    assert client.get(f"/v1/jobs/{uuid.uuid4()}/webhooks", headers=auth_headers).status_code == 404


@pytest.mark.e2e
def test_a_worker_announces_a_finished_job(live: Any, receiver: Receiver) -> None:
    from typer.testing import CliRunner

    import curvplan
    from curvplan.cli import app as cli

    env = {"CURVPLAN_URL": live.url, "CURVPLAN_API_KEY": live.api_key}
    made = CliRunner().invoke(cli, ["webhooks", "secret"], env=env)
    assert made.exit_code == 0, made.output
    secret = made.output.strip()
    assert secret.startswith("whsec_")
    with curvplan.Client(live.url, live.api_key) as api:
        job = api.submit_plan(full_measurements(), full_targets(), name="hooked",
                              webhook_url=receiver.url + "/done")  # fmt: skip
        assert api.wait(job.id, timeout=90).status == "succeeded"
        (got,) = receiver.wait_for(1)
        event = WebhookVerifier(secret).verify(got.body, got.headers)
        assert event.job.id == str(job.id) and event.type == "job.succeeded"
        assert (
            event.links.recommendation == f"http://public.example/v1/jobs/{job.id}/recommendation"
        )
        # the budget summary rides along: the headline numbers of the job's recommendation
        expected = headline_dict(api.get_recommendation(job.id))
        assert event.budget == expected and any(k.startswith("budget.") for k in expected)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            (delivery,) = api.list_webhook_deliveries(job.id).items
            if delivery.status == "succeeded":
                break
            time.sleep(0.1)
        assert delivery.status == "succeeded"
        assert [a.status_code for a in delivery.attempts] == [200]
    listed = CliRunner().invoke(cli, ["webhooks", "list", str(job.id)], env=env)
    assert listed.exit_code == 0 and "job.succeeded  succeeded" in listed.output
    assert "#1 " in listed.output and "HTTP 200" in listed.output
    time.sleep(1.5)  # the worker polls every second: it does not send it again
    assert len(receiver.requests) == 1
