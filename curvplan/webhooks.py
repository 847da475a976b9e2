"""Verify the webhooks a curvplan service sends (no server code, standard library + pydantic).

    from curvplan.webhooks import WebhookVerifier

    verifier = WebhookVerifier(secret)              # the project's whsec_… secret
    event = verifier.verify(request_body_bytes, request.headers)

Events are signed as Standard Webhooks specifies (https://www.standardwebhooks.com, the
scheme of OpenAI's and Svix's webhooks), so any of its libraries (``standardwebhooks`` on
PyPI) verifies them too. Headers:

- ``webhook-id``: the event id (dedupe on it);
- ``webhook-timestamp``: unix seconds of the signature;
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>." + body)>``; while a
  rotated-out secret still signs, one such entry per secret, space-separated; one valid entry
  suffices. ``key`` is the base64 decoding of the secret after ``whsec_``.

The id and the timestamp are signed with the exact body bytes, so a changed body, id or
timestamp or another secret fails; an event older (or newer) than ``tolerance`` seconds
fails (a replay of a captured request), and :class:`WebhookVerifier` also refuses an event id
it has already accepted (a replay within the tolerance).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from curvplan.types.webhooks import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookEvent,
)

DEFAULT_TOLERANCE_SECONDS = 300
SECRET_PREFIX = "whsec_"

__all__ = [
    "DEFAULT_TOLERANCE_SECONDS",
    "ID_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WebhookEvent",
    "WebhookVerificationError",
    "WebhookVerifier",
    "secret_key",
    "sign",
    "signature_headers",
    "verify",
]


class WebhookVerificationError(ValueError):
    """The request is not an authentic, fresh, first-seen curvplan event."""


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_…`` secret: the base64 decoding of what follows the prefix,
    read as the Standard Webhooks libraries read it (padding added, other characters
    skipped). A secret made before curvplan signed Standard Webhooks (URL-safe base64 without
    padding) that this reading cannot decode is read as URL-safe base64; rotate such a secret
    to verify with a Standard Webhooks library."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "==")
    except (binascii.Error, ValueError):
        key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256(key, "<msg_id>.<timestamp>." + body)>`` with ``secret``'s key."""
    message = f"{msg_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(secret_key(secret), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_headers(
    secrets: Iterable[str], msg_id: str, body: bytes, timestamp: int | None = None
) -> dict[str, str]:
    """The three headers of ``body`` signed now (or at ``timestamp``) with every secret in
    ``secrets`` (the current one, and a rotated-out one while it still signs)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    signatures = " ".join(sign(secret, msg_id, t, body) for secret in secrets)
    if not signatures:
        raise ValueError("no secret to sign with")
    return {ID_HEADER: msg_id, TIMESTAMP_HEADER: str(t), SIGNATURE_HEADER: signatures}


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"no {name} header")


def verify(
    body: bytes,
    headers: Mapping[str, str],
    secret: str,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> WebhookEvent:
    """The event in ``body`` if ``headers`` sign it with ``secret`` within ``tolerance`` s.

    Raises :class:`WebhookVerificationError` otherwise. Pass the raw request body: a body
    parsed and re-serialised is not the signed byte string.
    """
    msg_id = _header(headers, ID_HEADER)
    stamp = _header(headers, TIMESTAMP_HEADER)
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError(f"the {TIMESTAMP_HEADER} is not a number") from None
    offered = _header(headers, SIGNATURE_HEADER).split()
    if not offered or not all(entry.partition(",")[1] for entry in offered):
        raise WebhookVerificationError(f"malformed {SIGNATURE_HEADER} header (v1,<base64> …)")
    expected = sign(secret, msg_id, timestamp, body).encode()
    if not any(hmac.compare_digest(expected, entry.encode(errors="replace")) for entry in offered):
        raise WebhookVerificationError("the signature does not match the body and secret")
    age = (time.time() if now is None else now) - timestamp
    if abs(age) > tolerance:
        raise WebhookVerificationError(
            f"the signature is {age:.0f} s old (tolerance {tolerance:g} s): a replay?"
        )
    try:
        event = WebhookEvent.model_validate_json(body)
    except ValueError as exc:
        raise WebhookVerificationError(f"the body is not a curvplan event: {exc}") from None
    if event.id != msg_id:
        raise WebhookVerificationError(f"the {ID_HEADER} is not the event's id")
    return event


class WebhookVerifier:
    """:func:`verify` plus a memory of accepted event ids: a replayed event is refused.

    Keeps the last ``remember`` ids (an event is only accepted within ``tolerance`` of its
    signature, so ids older than that need not be kept by a receiver that sees fewer than
    ``remember`` events per tolerance window). Not shared between processes: a receiver
    with several processes dedupes on ``event.id`` in its own store.
    """

    def __init__(
        self, secret: str, *, tolerance: float = DEFAULT_TOLERANCE_SECONDS, remember: int = 10_000
    ) -> None:
        self.secret = secret
        self.tolerance = tolerance
        self.remember = remember
        self._seen: OrderedDict[str, None] = OrderedDict()

    def verify(
        self, body: bytes, headers: Mapping[str, str], *, now: float | None = None
    ) -> WebhookEvent:
        event = verify(body, headers, self.secret, tolerance=self.tolerance, now=now)
        if event.id in self._seen:
            raise WebhookVerificationError(f"event {event.id} was already received (a replay)")
        self._seen[event.id] = None
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        return event
