"""``/v1/worker/blobs/{sha256}``: workers on other hosts read and write blobs through the API.

A worker that shares no filesystem with the API fetches its input blobs here (into its own
cache) and uploads its output blobs here; it then writes the output's artifact row itself,
through the database, fenced by its attempt (docs/operations.md, "Workers on other hosts").
The routes need a service credential with the scope ``worker`` — the key a worker creates for
itself at start; a project key or an operator key without that scope gets 403.

An upload streams to a temp file under ``blobs/tmp`` while it is hashed and checked as
safetensors; its digest must equal the one in the path (422 otherwise, nothing kept), and it
is placed with the store's advisory lock (:func:`curvplan_core.storage.blobs.place_blob`),
which also refreshes its mtime: the garbage collector's grace period
(``CURVPLAN_BLOB_GC_GRACE_SECONDS``) then keeps the still unreferenced blob until the worker's
row insert, seconds later. In that insert's transaction the worker holds the blob's lock and
asks ``HEAD`` whether the blob is still there (uploading again if a deletion removed it).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse
from sqlalchemy import Engine

from curvplan.types.artifacts import is_sha256
from curvplan.types.storage import WorkerBlobOut
from curvplan_core.artifacts.blobstore import BlobStore, BlobTooLarge, BlobWriter, TempFileGone
from curvplan_core.artifacts.safetensors_format import HeaderTooLarge, InvalidSafetensors
from curvplan_core.credentials.service_keys import WORKER_SCOPE, ServiceContext
from curvplan_core.storage.blobs import place_blob
from curvplan_server.artifacts.router import temp_file_gone
from curvplan_server.auth.dependencies import require_scope
from curvplan_server.problems import Problem, problem_responses, validation_problem
from curvplan_server.storage.store import blob_store

router = APIRouter(prefix="/v1/worker/blobs", tags=["worker"])

WORKER_BLOBS_PREFIX = "/v1/worker/blobs/"
WorkerDep = Annotated[ServiceContext, Depends(require_scope(WORKER_SCOPE))]
# Checked by hand (not a pattern on the parameter) so that the problem names the field and
# the route is the same whatever the value.
Sha256Path = Annotated[str, Path(description="The blob's sha256, 64 lowercase hex digits.")]


def _digest(sha256: str) -> str:
    if not is_sha256(sha256):
        raise validation_problem(
            [
                {
                    "field": "path.sha256",
                    "loc": ["path", "sha256"],
                    "message": "must be a sha256 hex digest: 64 lowercase hex digits",
                    "type": "string_pattern_mismatch",
                }
            ]
        )
    return sha256


@router.get(
    "/{sha256}",
    name="get_worker_blob",
    summary="Download a stored blob by its sha256 (worker credential)",
    responses={
        **problem_responses(401, 403, 404, 422, 500, 503),
        200: {"content": {"application/octet-stream": {}}, "description": "The blob"},
    },
)
def get_worker_blob(request: Request, sha256: Sha256Path, worker: WorkerDep) -> FileResponse:
    """The blob's bytes (what a worker on another host caches); 404 if the store lacks it.

    The ``ETag`` is the digest: the worker verifies the sha256 of what it received.
    """
    path = blob_store(request).path_for(_digest(sha256))
    if not path.is_file():
        raise Problem(404, f"no blob {sha256} in the store", title="Not Found")
    return FileResponse(
        path, media_type="application/octet-stream", headers={"ETag": f'"{sha256}"'}
    )


@router.head(
    "/{sha256}",
    name="head_worker_blob",
    summary="Whether the store holds a blob (worker credential)",
    responses={
        **problem_responses(401, 403, 404, 422, 500, 503),
        200: {"description": "The store holds the blob (Content-Length: its size)"},
    },
)
def head_worker_blob(request: Request, sha256: Sha256Path, worker: WorkerDep) -> Response:
    """200 with the blob's size when the store holds it, else 404 (no body either way).

    A worker checks this under the blob's lock before it inserts an output's row, so that
    no deletion between its upload and the row leaves the row pointing at nothing.
    """
    path = blob_store(request).path_for(_digest(sha256))
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise Problem(404, f"no blob {sha256} in the store", title="Not Found") from None
    return Response(status_code=200, headers={"Content-Length": str(size), "ETag": f'"{sha256}"'})


@router.put(
    "/{sha256}",
    name="put_worker_blob",
    status_code=201,
    response_model=WorkerBlobOut,
    summary="Upload a job's output blob, addressed by its sha256 (worker credential)",
    responses={
        **problem_responses(401, 403, 408, 413, 422, 500, 503),
        200: {"model": WorkerBlobOut, "description": "The store already held this content"},
    },
)
async def put_worker_blob(request: Request, sha256: Sha256Path, worker: WorkerDep) -> JSONResponse:
    """Store the request body (a safetensors file) as blob ``sha256``.

    422 naming ``body`` when the body's sha256 differs from the path or it is not a valid
    safetensors file; 413 past ``CURVPLAN_WORKER_UPLOAD_MAX_BYTES``. Nothing is kept after
    a failure. The blob is not an artifact yet: the worker inserts the row (fenced by its
    attempt) right after, within the garbage collector's grace period.
    """
    digest = _digest(sha256)
    store = blob_store(request)
    settings = request.app.state.settings
    writer = store.writer(
        max_bytes=settings.worker_upload_max_bytes,
        max_header_bytes=settings.max_safetensors_header_bytes,
        max_tensors=settings.max_safetensors_tensors,
    )
    try:
        async for chunk in request.stream():
            if chunk:
                await run_in_threadpool(writer.write, chunk)
        await run_in_threadpool(writer.finish)
        if writer.sha256 != digest:
            raise _body_problem(
                f"the body's sha256 is {writer.sha256}, not the {digest} of the path",
                "digest_mismatch",
            )
        created = await run_in_threadpool(_place, request.app.state.engine, store, writer, digest)
    except HeaderTooLarge as exc:
        writer.abort()
        raise Problem(
            413,
            f"{exc.reason} (CURVPLAN_MAX_SAFETENSORS_HEADER_BYTES)",
            title="Content Too Large",
            extra={"max_header_bytes": exc.limit},
        ) from None
    except InvalidSafetensors as exc:
        writer.abort()
        raise _body_problem(
            f"not a valid safetensors file: {exc.reason}", "invalid_safetensors"
        ) from None
    except BlobTooLarge as exc:
        writer.abort()
        raise Problem(
            413,
            f"the blob exceeds the worker upload limit of {exc.limit} bytes",
            title="Content Too Large",
            extra={"max_body_bytes": exc.limit},
        ) from None
    except TempFileGone:
        writer.abort()
        raise temp_file_gone(settings.temp_file_max_age_seconds) from None
    except BaseException:
        writer.abort()
        raise
    out = WorkerBlobOut(sha256=digest, size_bytes=writer.size, created=created)
    return JSONResponse(out.model_dump(), status_code=201 if created else 200)


def _place(engine: Engine, store: BlobStore, writer: BlobWriter, digest: str) -> bool:
    """Move the verified temp file to its address under the digest's lock; True if new."""
    existed = store.exists(digest)
    with engine.begin() as conn:
        place_blob(conn, store, writer.temp_path, digest)
    return not existed


def _body_problem(message: str, type: str) -> Problem:
    return validation_problem(
        [{"field": "body", "loc": ["body"], "message": message, "type": type}]
    )
