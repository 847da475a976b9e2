"""Short-lived signed report links: an HMAC-SHA256 token over (job, project, expiry).

A browser cannot send the ``Authorization`` header, so ``POST /v1/jobs/{id}/report-link``
(authenticated) returns a URL carrying ``expires`` (Unix seconds) and ``token``. The
token binds the job *and its project*, so it opens that one report until it expires
and nothing else. The key is ``Settings.report_link_secret``; without one, a random
key is created once in ``DATA_DIR/report-link-secret`` (0600) and reused.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import threading
import time
import uuid
from pathlib import Path

from curvplan_core.config import Settings

SECRET_FILE = "report-link-secret"
_lock = threading.Lock()
_cached: dict[Path, bytes] = {}


def link_secret(settings: Settings) -> bytes:
    """The HMAC key: from settings, else the data dir's key file (created on first use).

    The file is created atomically: the key is written and synced to a private temporary
    file, which is then hard-linked to its final name (``link`` fails if the name exists).
    A process starting at the same moment either loses the race and reads the complete
    winner's key, or finds no file yet; it never sees an empty or half-written file.
    An empty key is refused rather than used.
    """
    if settings.report_link_secret is not None:
        key = settings.report_link_secret.get_secret_value().encode()
        if not key.strip():
            raise RuntimeError("CURVPLAN_REPORT_LINK_SECRET is empty; set a long random value")
        return key
    path = (settings.data_dir / SECRET_FILE).resolve()
    with _lock:
        if path in _cached:
            return _cached[path]
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _create_atomically(path, secrets.token_hex(32).encode() + b"\n")
        key = path.read_bytes().strip()
        if not key:
            raise RuntimeError(
                f"the report-link key file {path} is empty; delete it (a new key is created) "
                "or set CURVPLAN_REPORT_LINK_SECRET"
            )
        _cached[path] = key
        return key


def _create_atomically(path: Path, content: bytes) -> None:
    """Make ``path`` hold ``content`` in one step, unless it exists already (then keep it)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):  # another process won: its key is complete
            os.link(temp, path)
    finally:
        temp.unlink(missing_ok=True)


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
