"""Short-lived signed report links: an HMAC-SHA256 token over (job, project, expiry).

A browser cannot send the ``Authorization`` header, so ``POST /v1/jobs/{id}/report-link``
(authenticated) returns a URL carrying ``expires`` (Unix seconds) and ``token``. The
token binds the job *and its project*, so it opens that one report until it expires
and nothing else. The key is ``Settings.report_link_secret``; without one, a random
key is created once in ``DATA_DIR/report-link-secret`` (0600) and reused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
import time
import uuid
from pathlib import Path

from curvplan_server.config import Settings

SECRET_FILE = "report-link-secret"
_lock = threading.Lock()
_cached: dict[Path, bytes] = {}


def link_secret(settings: Settings) -> bytes:
    """The HMAC key: from settings, else the data dir's key file (created on first use)."""
    if settings.report_link_secret is not None:
        return settings.report_link_secret.get_secret_value().encode()
    path = (settings.data_dir / SECRET_FILE).resolve()
    with _lock:
        if path in _cached:
            return _cached[path]
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            key = path.read_bytes().strip()
        else:
            key = secrets.token_hex(32).encode()
            with os.fdopen(fd, "wb") as fh:
                fh.write(key + b"\n")
        _cached[path] = key
        return key


def sign(secret: bytes, job_id: uuid.UUID, project_id: uuid.UUID, expires: int) -> str:
    """The token of a link to ``job_id``'s report valid until ``expires`` (Unix seconds)."""
    message = f"curvplan-report:v1:{job_id}:{project_id}:{expires}".encode()
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def verify(
    secret: bytes,
    job_id: uuid.UUID,
    project_id: uuid.UUID,
    expires: int,
    token: str,
    now: float | None = None,
) -> str | None:
    """None when the token is valid now; otherwise why not (expired, or a bad signature)."""
    expected = sign(secret, job_id, project_id, expires)
    if not hmac.compare_digest(expected.encode(), token.encode()):
        return "the report link's signature is not valid"
    if (time.time() if now is None else now) >= expires:
        return "the report link has expired; ask for a new one (curvplan report JOB --open)"
    return None
