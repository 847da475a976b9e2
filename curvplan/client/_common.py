"""What the sync and async clients share: configuration, retry policy, requests, parsing.

The two clients differ only in how they send a request and sleep; everything that
decides *what* to send and *what an answer means* lives here, once.
"""

from __future__ import annotations

import hashlib
import os
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Required, TypedDict

import httpx

from curvplan.client.errors import (
    PROBLEM_MEDIA_TYPE,
    ArtifactIntegrityError,
    ConnectionFailedError,
    CurvplanError,
    error_from_problem,
)
from curvplan.types.json_types import ReadJson

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "CURVPLAN_URL"
API_KEY_ENV = "CURVPLAN_API_KEY"
ARTIFACT_KINDS = ("checkpoint", "dataset")
# How long one long-poll request asks the server to hold (the server caps it too).
LONG_POLL_SECONDS = 30.0
# Extra read time on top of the long-poll wait before the client gives up on a request.
LONG_POLL_SLACK_SECONDS = 15.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for connection errors and 503 answers (502/504 on idempotent calls).

    Attempt ``n`` (0-based) waits ``min(backoff_max, backoff_initial·multiplier^n)``
    seconds, ±``jitter`` (a fraction), and at least the server's ``Retry-After`` when it
    sends one (capped by ``backoff_max``). The default ``max_retries`` rides out about
    17 s of a restarting database (503 + ``Retry-After: 1``). ``max_retries`` bounds
    ordinary calls;
    ``wait`` instead rides out an unreachable or unavailable server for up to
    ``outage_seconds`` in a row (a restart, a deploy) before it gives up.

    A 429 (a rate limit: the request was not handled, so resending is safe for any call) is
    retried after the server's ``Retry-After`` in full, not capped by ``backoff_max``, when
    that is at most ``rate_limit_wait_max`` seconds; a longer wait raises
    :class:`~curvplan.client.errors.RateLimitedError` at once rather than sleep for it.
    """

    max_retries: int = 6
    backoff_initial: float = 0.25
    backoff_max: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.1
    outage_seconds: float = 120.0
    rate_limit_wait_max: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to sleep before retry number ``attempt + 1``."""
        base = min(self.backoff_max, self.backoff_initial * self.multiplier**attempt)
        spread = base * self.jitter
        backoff = max(0.0, base + random.uniform(-spread, spread))
        if retry_after is not None:
            # The server's delay is a minimum; a longer outage still backs off.
            return max(0.0, min(max(retry_after, backoff), self.backoff_max))
        return backoff


NO_RETRY = RetryPolicy(max_retries=0)


def resolve_base_url(base_url: str | None) -> str:
    """``base_url``, else ``$CURVPLAN_URL``, else ``http://127.0.0.1:8000`` (no trailing /)."""
    url = (base_url or os.environ.get(URL_ENV) or DEFAULT_URL).strip()
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"the curvplan URL must start with http:// or https://, got {url!r}")
    return url.rstrip("/")


def resolve_api_key(api_key: str | None) -> str | None:
    """``api_key``, else ``$CURVPLAN_API_KEY``, else None (a server with auth on answers 401)."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if key is None:
        return None
    return key.strip() or None


def default_headers(api_key: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    from curvplan import __version__

    headers = {"User-Agent": f"curvplan-client/{__version__}", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    headers.update(extra or {})
    return headers


@dataclass
class Upload:
    """A file sent as multipart ``file`` (streamed from disk, reopened on every attempt)."""

    path: Path
    fields: dict[str, str]


@dataclass
class Call:
    """One API call: what to send, and whether resending it after it may have arrived is safe."""

    method: str
    path: str
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    upload: Upload | None = None
    idempotent: bool = True
    expect: str = "json"  # or "text", "bytes"


def is_retryable_transport_error(exc: httpx.TransportError, call: Call) -> bool:
    """Connection never made → always safe; broken mid-way → only for idempotent calls."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return True
    return call.idempotent and isinstance(
        exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError | httpx.TimeoutException
    )


def should_retry_status(status: int, call: Call) -> bool:
    """503 means the request was not handled: always worth retrying. A gateway's 502/504
    (a restart behind a proxy) may hide a handled request: only for idempotent calls."""
    return status == 503 or (status in (502, 504) and call.idempotent)


def retry_delay(policy: RetryPolicy, attempt: int, response: httpx.Response,
                call: Call) -> float | None:  # fmt: skip
    """Seconds to wait before sending ``call`` again after ``response``, or None: do not.

    A 429 waits the server's ``Retry-After`` (else the backoff), when it is at most
    ``policy.rate_limit_wait_max``; 503 (and 502/504 on idempotent calls) the backoff, at
    least the ``Retry-After``, capped by ``policy.backoff_max``."""
    if attempt >= policy.max_retries:
        return None
    status = response.status_code
    if status == 429:
        wait = retry_after_seconds(response)
        if wait is None:
            return policy.delay(attempt)
        return wait if wait <= policy.rate_limit_wait_max else None
    if should_retry_status(status, call):
        return policy.delay(attempt, retry_after_seconds(response))
    return None


def connection_error(call: Call, base_url: str, exc: Exception) -> ConnectionFailedError:
    return ConnectionFailedError(
        f"could not reach the curvplan service at {base_url} ({call.method} {call.path}): "
        f"{type(exc).__name__}: {exc or 'no detail'}; check CURVPLAN_URL and that the server runs",
        title="Connection Failed",
    )


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds (delta-seconds or an HTTP date), if any."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from datetime import UTC, datetime

        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def raise_for_problem(response: httpx.Response) -> None:
    """Raise the :class:`CurvplanError` subclass for a non-2xx answer."""
    if response.is_success:
        return
    content_type = response.headers.get("content-type", "")
    body: Any = None
    if PROBLEM_MEDIA_TYPE in content_type or "json" in content_type:
        try:
            body = response.json()
        except ValueError:
            body = None
    text = response.text.strip()[:500] if body is None else None
    error = error_from_problem(response.status_code, body, text or None)
    error.request_id = response.headers.get("x-request-id")
    raise error


def decode(response: httpx.Response, call: Call) -> Any:
    raise_for_problem(response)
    if call.expect == "text":
        return response.text
    if call.expect == "bytes":
        return response.content
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        raise CurvplanError(
            f"{call.method} {call.path} answered {response.status_code} with a body that is "
            "not JSON",
            status=response.status_code,
            title="Unexpected Response",
        ) from None


# --------------------------------------------------------------------------- call builders
def job_path(job_id: str | uuid.UUID, suffix: str = "") -> str:
    return f"/v1/jobs/{_uuid(job_id, 'job_id')}{suffix}"


def plot_path(job_id: str | uuid.UUID, name: str, fmt: str) -> str:
    if fmt not in ("svg", "png"):
        raise ValueError(f"fmt must be 'svg' or 'png', not {fmt!r}")
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"not a plot name: {name!r}")
    return job_path(job_id, f"/plots/{name}.{fmt}")


def artifact_path(artifact_id: str | uuid.UUID) -> str:
    return f"/v1/artifacts/{_uuid(artifact_id, 'artifact_id')}"


def _uuid(value: str | uuid.UUID, name: str) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ValueError(f"{name} must be a UUID, got {value!r}") from None


def submit_call(body: Mapping[str, Any], idempotency_key: str | None) -> Call:
    """POST /v1/jobs; a fresh Idempotency-Key makes the call safe to resend."""
    key = idempotency_key or f"curvplan-client-{uuid.uuid4()}"
    return Call("POST", "/v1/jobs", json=dict(body), headers={"Idempotency-Key": key})


class JobBody(TypedDict, total=False):
    """A ``POST /v1/jobs`` body as the client builds it (the service validates it against
    ``curvplan.types.jobs``; the client first with :mod:`curvplan.client.precheck`)."""

    kind: Required[str]
    measurements: ReadJson
    targets: ReadJson
    model: ReadJson
    checkpoint: str | list[str]
    dataset: str
    intermediate_checkpoints: list[str | list[str]]
    sweeps: list[str]
    options: dict[str, ReadJson]
    resources: dict[str, int]
    intermediate_steps: list[int | None]
    intermediate_logged_losses: list[float | None]
    webhook_url: str
    name: str
    tags: dict[str, str]
    max_attempts: int


def plan_body(
    measurements: Mapping[str, Any] | Any,
    targets: Mapping[str, Any] | Any | None,
    name: str | None,
    tags: Mapping[str, str] | None,
    max_attempts: int | None,
) -> JobBody:
    body: JobBody = {"kind": "plan", "measurements": _jsonable(measurements)}
    if targets is not None:
        body["targets"] = _jsonable(targets)
    return _common_fields(body, name, tags, max_attempts)


def artifact_id(artifact: Any) -> str:
    """An artifact's id from an ``Artifact`` result or the id itself (str or UUID)."""
    return str(getattr(artifact, "id", artifact))


def analyze_body(
    model: Mapping[str, Any] | Any,
    checkpoint: Any,
    dataset: Any,
    name: str | None,
    tags: Mapping[str, str] | None,
    options: Mapping[str, Any] | None,
    targets: Mapping[str, Any] | Any | None,
    max_attempts: int | None,
    intermediate_checkpoints: Sequence[Any] = (),
    sweeps: Sequence[Any] = (),
    devices: int | None = None,
) -> JobBody:
    """The ``analyze`` job body; artifacts (and sweep jobs) may be given as results or ids, a
    checkpoint also as a list of shards; ``devices`` is ``resources.devices``."""
    body: JobBody = {
        "kind": "analyze",
        "model": _jsonable(model),
        "checkpoint": _checkpoint_ref(checkpoint),
        "dataset": artifact_id(dataset),
    }
    if intermediate_checkpoints:
        body["intermediate_checkpoints"] = [_checkpoint_ref(a) for a in intermediate_checkpoints]
    if sweeps:
        body["sweeps"] = [artifact_id(j) for j in sweeps]
    if options:
        body["options"] = dict(options)
    if targets is not None:
        body["targets"] = _jsonable(targets)
    if devices is not None:
        body["resources"] = {"devices": devices}
    return _common_fields(body, name, tags, max_attempts)


def _checkpoint_ref(value: Any) -> str | list[str]:
    if isinstance(value, list | tuple):
        return [artifact_id(a) for a in value]
    return artifact_id(value)


# --------------------------------------------------------------------------- analyze inputs
Source = Any  # an artifact result, an id (str or UUID), or a local file (Path)


@dataclass
class AnalyzeSources:
    """What an analyze submission names: the model JSON, and each artifact field as ids or
    local files still to upload (a list for a sharded checkpoint)."""

    model: Any
    checkpoint: Source | list[Source]
    dataset: Source
    intermediates: list[Source | list[Source]]
    intermediate_steps: list[int | None] | None = None
    intermediate_logged_losses: list[float | None] | None = None

    def uploads(self) -> list[tuple[Path, str]]:
        """Local files to upload, each once, with their artifact kind (checkpoints first)."""
        out: dict[Path, str] = {}
        for ref in [self.checkpoint, *self.intermediates]:
            for item in ref if isinstance(ref, list) else [ref]:
                if isinstance(item, Path):
                    out.setdefault(item, "checkpoint")
        if isinstance(self.dataset, Path):
            out.setdefault(self.dataset, "dataset")
        return list(out.items())

    def resolved(self, uploaded: Mapping[Path, str]) -> tuple[Any, Any, list[Any]]:
        """(checkpoint, dataset, intermediates) with every local file replaced by its id."""

        def one(item: Source) -> Any:
            return uploaded[item] if isinstance(item, Path) else item

        def ref(value: Source | list[Source]) -> Any:
            return [one(v) for v in value] if isinstance(value, list) else one(value)

        return ref(self.checkpoint), one(self.dataset), [ref(r) for r in self.intermediates]


def _local_or_id(value: Any, option: str) -> Source:
    """A path becomes a Path to upload; an artifact or a UUID (string) stays an id."""
    if isinstance(value, os.PathLike):
        path = Path(value)
    elif isinstance(value, str):
        try:
            return str(uuid.UUID(value))
        except ValueError:
            path = Path(value)
    else:
        return value  # an Artifact result or a uuid.UUID
    if not path.is_file():
        raise FileNotFoundError(f"{option}: file not found: {path}")
    return path


def _checkpoint_source(value: Any, option: str) -> Source | list[Source]:
    """A save_pretrained directory → its shard files; else an id, a file or a list of them."""
    from curvplan.client.pretrained import is_pretrained_dir, read_pretrained

    if is_pretrained_dir(value):
        shards = list(read_pretrained(value).shards)
        return shards if len(shards) > 1 else shards[0]
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError(f"{option}: an empty list of shards")
        return [_local_or_id(v, option) for v in value]
    return _local_or_id(value, option)


def analyze_sources(
    model: Any,
    checkpoint: Any,
    dataset: Any,
    intermediate_checkpoints: Sequence[Any],
    w_star: str | None = None,
) -> AnalyzeSources:
    """Sort out what ``submit_analyze`` was given (see its docstring)."""
    from curvplan.client.pretrained import is_pretrained_dir, read_pretrained
    from curvplan.client.trainer_run import is_trainer_run

    if dataset is None:
        raise ValueError("dataset: give the evaluation sample (an artifact, its id or a file)")
    if is_trainer_run(model):
        return _run_sources(model, checkpoint, dataset, intermediate_checkpoints, w_star)
    if w_star is not None:
        raise ValueError(
            "w_star: names a checkpoint-<step> subfolder of a Trainer output folder; "
            f"{model if isinstance(model, str | os.PathLike) else 'the model'} is not one"
        )
    if isinstance(model, str | os.PathLike):
        if not is_pretrained_dir(model):
            raise ValueError(
                f"model: {model} is not a save_pretrained directory (no config.json in it); "
                "give the directory or a model spec object"
            )
        pretrained = read_pretrained(model)
        if checkpoint is not None:
            raise ValueError(
                "checkpoint: the weights come from the model directory; do not give both"
            )
        model_json: Any = pretrained.model
        shards = list(pretrained.shards)
        ckpt: Source | list[Source] = shards if len(shards) > 1 else shards[0]
    else:
        if checkpoint is None:
            raise ValueError("checkpoint: give the weights (or pass a save_pretrained directory)")
        model_json = _jsonable(model)
        ckpt = _checkpoint_source(checkpoint, "checkpoint")
    return AnalyzeSources(
        model_json,
        ckpt,
        _local_or_id(dataset, "dataset"),
        [
            _checkpoint_source(v, f"intermediate_checkpoints[{i}]")
            for i, v in enumerate(intermediate_checkpoints)
        ],
    )


def _run_sources(
    model: Any,
    checkpoint: Any,
    dataset: Any,
    intermediate_checkpoints: Sequence[Any],
    w_star: str | None,
) -> AnalyzeSources:
    """A Trainer output folder: w* (the last or the named checkpoint-<step>) and every
    earlier checkpoint as an intermediate, with its step and logged loss."""
    from curvplan.client.trainer_run import read_trainer_run

    if checkpoint is not None:
        raise ValueError("checkpoint: the weights come from the run folder; do not give both")
    if intermediate_checkpoints:
        raise ValueError(
            "intermediate_checkpoints: the run folder's checkpoint-<step> subfolders before "
            "w* are the intermediate checkpoints; do not give both"
        )
    run = read_trainer_run(model, w_star)

    def shards(pretrained: Any) -> Source | list[Source]:
        files = list(pretrained.shards)
        return files if len(files) > 1 else files[0]

    losses = [c.logged_loss for c in run.intermediates]
    return AnalyzeSources(
        run.model,
        shards(run.w_star.pretrained),
        _local_or_id(dataset, "dataset"),
        [shards(c.pretrained) for c in run.intermediates],
        [c.step for c in run.intermediates] or None,
        losses if any(v is not None for v in losses) else None,
    )


def with_intermediate_logs(body: JobBody, sources: AnalyzeSources) -> JobBody:
    """``body`` with the intermediate checkpoints' steps and logged losses when known (a
    Trainer output folder gives them)."""
    if sources.intermediate_steps is not None:
        body["intermediate_steps"] = list(sources.intermediate_steps)
    if sources.intermediate_logged_losses is not None:
        body["intermediate_logged_losses"] = list(sources.intermediate_logged_losses)
    return body


def with_webhook(body: JobBody, webhook_url: str | None) -> JobBody:
    """``body`` with ``webhook_url`` set when given (the service checks its host)."""
    if webhook_url is not None:
        body["webhook_url"] = webhook_url
    return body


def _common_fields(
    body: JobBody, name: str | None, tags: Mapping[str, str] | None, max_attempts: int | None
) -> JobBody:
    if name is not None:
        body["name"] = name
    if tags:
        body["tags"] = dict(tags)
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    return body


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    return dict(value) if isinstance(value, Mapping) else value


def list_params(
    status: str | list[str] | None,
    kind: str | None,
    name: str | None,
    tags: Mapping[str, str] | None,
    page_size: int | None,
    page_token: str | None,
) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = []
    if status:
        statuses = [status] if isinstance(status, str) else list(status)
        params.append(("status", ",".join(statuses)))
    for key, value in (("kind", kind), ("name", name), ("page_token", page_token)):
        if value is not None:
            params.append((key, value))
    if page_size is not None:
        params.append(("page_size", str(page_size)))
    params.extend(("tag", f"{k}:{v}") for k, v in (tags or {}).items())
    return params


def upload_call(path: str | os.PathLike[str], kind: str) -> tuple[Call, str]:
    """POST /v1/artifacts for ``path``; also returns the file's sha256 to check the answer."""
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"artifact kind must be one of {ARTIFACT_KINDS}, got {kind!r}")
    file_path = Path(path)
    if not file_path.is_file():
        raise FileNotFoundError(f"artifact file not found: {file_path}")
    digest = sha256_file(file_path)
    # Artifacts are content-addressed: sending the same file twice yields the same artifact,
    # so a resend after a broken connection is safe.
    call = Call("POST", "/v1/artifacts", upload=Upload(file_path, {"kind": kind}), timeout=None)
    return call, digest


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def check_artifact(answer: Mapping[str, ReadJson], local_sha256: str, path: Path) -> None:
    """The server's sha256 of an upload (its answer's JSON) against the local file's."""
    remote = answer.get("sha256")
    if remote is not None and remote != local_sha256:
        raise ArtifactIntegrityError(
            f"the server stored {path} with sha256 {remote}, but the file's sha256 is "
            f"{local_sha256}: the upload was corrupted; retry it",
            title="Artifact Integrity",
        )


def wait_call(job_id: str | uuid.UUID, wait_seconds: float) -> Call:
    wait_seconds = max(0.0, wait_seconds)
    return Call(
        "GET",
        job_path(job_id),
        params=[("wait", f"{wait_seconds:.3f}")],
        timeout=wait_seconds + LONG_POLL_SLACK_SECONDS,
    )


def progress_key(job: Any) -> tuple[Any, ...]:
    """What ``on_progress`` reacts to: a change of status or progress, its own or (a fan-out
    waiting for its children) a child's status, stage or ETA."""
    p = job.progress
    children = tuple(
        (c.status, c.stage, c.eta_seconds) for c in getattr(job, "children", None) or ()
    )
    return (
        job.status,
        None if p is None else (p.fraction, p.stage, p.message, p.eta_seconds),
        children,
    )


def absolute_link(link: Any, base_url: str) -> Any:
    """Point a report link at the URL this client uses (the server may sit behind a proxy)."""
    path = getattr(link, "path", None) or link.url
    if isinstance(path, str) and path.startswith("/"):
        return link.model_copy(update={"url": base_url + path})
    return link
