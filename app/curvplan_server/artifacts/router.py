"""HTTP routes of the artifact resource: streamed uploads, uri registration, metadata, content."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from curvplan.types.artifacts import (
    ArtifactOut,
    ArtifactPage,
    ArtifactUriCreate,
    MetadataPage,
    TensorPage,
    uri_allowed,
)
from curvplan_core.artifacts.blobstore import BlobTooLarge, BlobWriter, TempFileGone
from curvplan_core.artifacts.checks import ArtifactContentError
from curvplan_core.artifacts.header_checks import check_header
from curvplan_core.artifacts.safetensors_format import (
    HeaderTooLarge,
    InvalidSafetensors,
    MetadataTooLarge,
)
from curvplan_core.storable import shown, storable_text
from curvplan_server.artifacts import service
from curvplan_server.artifacts.commit import commit_upload, early_quota_check, register_uri
from curvplan_server.artifacts.header_gate import HeaderGateFull, gate_full_problem, header_gate
from curvplan_server.artifacts.models import ARTIFACT_KINDS, UPLOAD_KINDS
from curvplan_server.artifacts.service import ArtifactJson
from curvplan_server.artifacts.upload import UploadForm, UploadFormError, boundary_of
from curvplan_server.auth.dependencies import ProjectDep
from curvplan_server.db import SessionDep
from curvplan_server.problems import (
    PROBLEM_RESPONSES,
    PROBLEM_TYPE_BASE,
    Problem,
    field_errors_from_pydantic,
    problem_responses,
    validation_problem,
)
from curvplan_server.storage.quota import Quota
from curvplan_server.storage.store import blob_store

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])

MAX_NAME_LENGTH = 200
"""Characters of an artifact's name (the ``name`` field; a longer file name is cut)."""

UPLOAD_OVERHEAD_BYTES = 64 * 1024
"""Room for multipart boundaries and headers above the file size limit (middleware limit)."""


def _field_problem(field: str, message: str, type_: str) -> Problem:
    loc: list[str | int] = ["body", field]
    return validation_problem(
        [{"field": f"body.{field}", "loc": loc, "message": message, "type": type_}],
        detail=f"body.{field}: {message}",
    )


def _invalid_file(reason: str, tensor: str | None, kind: str, title: str) -> Problem:
    # Names come from the client's header: escape what JSON answers cannot carry raw.
    reason, tensor = shown(reason), (shown(tensor) if tensor is not None else None)
    detail = reason if tensor is None else f"tensor {tensor!r}: {reason}"
    return Problem(
        422,
        detail,
        title=title,
        type=PROBLEM_TYPE_BASE + kind,
        errors=[
            {
                "field": "body.file" + (f".{tensor}" if tensor else ""),
                "loc": ["body", "file", *([tensor] if tensor else [])],
                "message": detail,
                "type": kind,
            }
        ],
        extra={"tensor": tensor, "reason": reason},
    )


@router.post(
    "",
    name="create_artifact",
    status_code=201,
    response_model=ArtifactOut,
    summary="Upload a safetensors checkpoint or dataset (multipart), or register a file:// uri",
    responses={
        **PROBLEM_RESPONSES,
        **problem_responses(_408="The upload stalled past the temp-file age limit; send it again"),
        200: {"model": ArtifactOut, "description": "Already stored"},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file", "kind"],
                        "properties": {
                            "file": {"type": "string", "format": "binary"},
                            "kind": {"type": "string", "enum": list(UPLOAD_KINDS)},
                            "name": {"type": "string", "maxLength": MAX_NAME_LENGTH},
                        },
                    }
                },
                "application/json": {"schema": ArtifactUriCreate.model_json_schema()},
            },
        }
    },
)
async def create_artifact(request: Request, session: SessionDep, auth: ProjectDep) -> JSONResponse:
    """Store an artifact: 201 with its metadata, or 200 when this project already has the content.

    The multipart ``file`` is streamed to a temp file while it is hashed and validated
    (safetensors header, offsets, length; kind rules), then moved to its content address.
    Any failure deletes the temp file and stores nothing.
    """
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media == "application/json":
        return await _register_uri(request, session, auth.project_id)
    if media != "multipart/form-data":
        raise Problem(
            415,
            "send multipart/form-data with fields 'file' and 'kind', or application/json "
            f"with 'kind' and 'uri'; got {media or 'no Content-Type'!r}",
            title="Unsupported Media Type",
        )
    settings = request.app.state.settings
    store = blob_store(request)
    limit = settings.max_artifact_bytes
    query_kind = request.query_params.get("kind")
    if query_kind is not None and query_kind not in UPLOAD_KINDS:
        raise validation_problem(
            [
                {
                    "field": "query.kind",
                    "loc": ["query", "kind"],
                    "message": f"must be one of {list(UPLOAD_KINDS)}",
                    "type": "enum",
                }
            ]
        )
    quota = Quota.from_settings(settings)
    if quota.max_bytes is not None:  # a file that cannot fit is refused before it is read
        await run_in_threadpool(
            early_quota_check, session, auth.project_id, quota, _content_length(request)
        )

    gate = header_gate(request)
    held: list[int] = []  # what this upload's header took from the gate (given back below)

    def take_header_memory(header_bytes: int) -> None:
        held.append(gate.take(header_bytes))

    def open_writer() -> BlobWriter:
        # The kind known before the file (``?kind=`` or a ``kind`` field sent first) lets
        # the header be checked as soon as it arrives, before the body is read.
        writer = store.writer(
            max_bytes=limit,
            max_header_bytes=settings.max_safetensors_header_bytes,
            max_tensors=settings.max_safetensors_tensors,
            max_metadata_bytes=settings.max_safetensors_metadata_bytes,
        )
        writer.validator.on_header_length = take_header_memory
        early_kind = query_kind or form.fields.get("kind")
        if early_kind in UPLOAD_KINDS:
            writer.on_header = lambda info, declared: check_header(
                early_kind, info, declared, limit
            )
        return writer

    try:
        form = UploadForm(boundary_of(request.headers["content-type"]), open_writer)
    except UploadFormError as exc:
        raise Problem(exc.status, str(exc)) from None
    try:
        async for chunk in request.stream():
            if chunk:
                await run_in_threadpool(form.write, chunk)
        form.close()
        assert form.writer is not None
        kind = form.fields.get("kind") or query_kind or ""
        if kind not in UPLOAD_KINDS:
            raise _field_problem(
                "kind", f"must be one of {list(UPLOAD_KINDS)}, not {shown(kind)!r}", "enum"
            )
        if query_kind is not None and kind != query_kind:
            raise _field_problem("kind", f"the form says {kind!r}, the URL {query_kind!r}", "enum")
        info = await run_in_threadpool(form.writer.finish)
        await run_in_threadpool(check_header, kind, info, info.total_bytes, limit)
        name = _upload_name(form)
        stored = await run_in_threadpool(
            commit_upload,
            session,
            store,
            form.writer,
            auth.project_id,
            kind,
            name,
            info.to_json(),
            quota,
            settings.artifact_tensor_preview,
        )
    except UploadFormError as exc:
        _abort(form)
        if exc.field is not None and exc.status == 422:
            raise _field_problem(exc.field, str(exc), "invalid_form") from None
        raise Problem(exc.status, str(exc)) from None
    except HeaderTooLarge as exc:
        _abort(form)
        raise _header_too_large(exc) from None
    except MetadataTooLarge as exc:
        _abort(form)
        raise Problem(
            413,
            f"{exc.reason} (CURVPLAN_MAX_SAFETENSORS_METADATA_BYTES)",
            title="Content Too Large",
            extra={"max_metadata_bytes": exc.limit},
        ) from None
    except InvalidSafetensors as exc:
        _abort(form)
        raise _invalid_file(
            exc.reason, exc.tensor, "invalid-safetensors", "Invalid Safetensors File"
        ) from None
    except ArtifactContentError as exc:
        _abort(form)
        raise _invalid_file(
            exc.reason, exc.tensor, "invalid-artifact", "Invalid Artifact Content"
        ) from None
    except BlobTooLarge as exc:
        _abort(form)
        raise Problem(
            413,
            f"the file exceeds the artifact size limit of {exc.limit} bytes",
            title="Content Too Large",
            extra={"max_artifact_bytes": exc.limit},
        ) from None
    except TempFileGone:
        _abort(form)
        raise temp_file_gone(settings.temp_file_max_age_seconds) from None
    except HeaderGateFull:
        _abort(form)
        raise gate_full_problem() from None
    except BaseException:
        _abort(form)
        raise
    finally:
        for cost in held:
            gate.give(cost)
    artifact = stored.artifact
    status = 201 if stored.created else 200
    return JSONResponse(
        artifact, status_code=status, headers={"Location": artifact["links"]["self"]}
    )


def temp_file_gone(max_age_seconds: float) -> Problem:
    """408: the upload was so slow that the temp-file sweeper removed what it had written."""
    return Problem(
        408,
        "the upload stalled for longer than the service keeps an unfinished upload "
        f"(CURVPLAN_TEMP_FILE_MAX_AGE_SECONDS = {max_age_seconds:g} s) and its partial file "
        "was removed; nothing was stored: send the file again",
        title="Request Timeout",
        extra={"temp_file_max_age_seconds": max_age_seconds},
    )


def _header_too_large(exc: HeaderTooLarge) -> Problem:
    return Problem(
        413,
        f"{exc.reason} (CURVPLAN_MAX_SAFETENSORS_HEADER_BYTES)",
        title="Content Too Large",
        extra={"max_header_bytes": exc.limit},
    )


def _upload_name(form: UploadForm) -> str | None:
    """The artifact's name: the ``name`` field, else the file name; text PostgreSQL stores."""
    if form.fields.get("name"):
        field, name = "name", form.fields["name"]
    elif form.filename:
        field, name = "file", form.filename
    else:
        return None
    if not storable_text(name):
        what = "the name" if field == "name" else "the file name"
        raise _field_problem(field, f"{what} must not contain NUL characters", "string_nul")
    if len(name) > MAX_NAME_LENGTH:
        if field == "name":
            raise _field_problem(
                "name", f"must be at most {MAX_NAME_LENGTH} characters", "string_too_long"
            )
        name = name[:MAX_NAME_LENGTH]  # a file name is only the default label
    return name


def _abort(form: UploadForm) -> None:
    if form.writer is not None:
        form.writer.abort()


def _content_length(request: Request) -> int | None:
    try:
        return int(request.headers["content-length"])
    except (KeyError, ValueError):
        return None


async def _register_uri(request: Request, session: Session, project_id: uuid.UUID) -> JSONResponse:
    raw = await request.body()
    try:
        body = ArtifactUriCreate.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise Problem(
                400, "the request body is not valid JSON", title="Malformed JSON"
            ) from None
        raise validation_problem(field_errors_from_pydantic(errors, prefix=("body",))) from None

    roots = request.app.state.settings.artifact_uri_roots
    if not roots:
        raise _field_problem(
            "uri",
            "file:// artifacts are disabled on this service: the operator has not configured "
            "CURVPLAN_ARTIFACT_URI_ROOTS (upload the file instead)",
            "uri_not_allowed",
        )
    if not uri_allowed(body.uri, roots):
        # The same answer whether the path exists, is a directory or is missing.
        raise _field_problem(
            "uri",
            "file:// artifacts must lie under one of the configured directories "
            f"({', '.join(str(r) for r in roots)})",
            "uri_not_allowed",
        )

    def insert() -> ArtifactJson:
        return register_uri(
            session,
            project_id,
            kind=body.kind,
            uri=body.uri,
            name=body.name,
            quota=Quota.from_settings(request.app.state.settings),
        )

    artifact = await run_in_threadpool(insert)
    return JSONResponse(artifact, status_code=201, headers={"Location": artifact["links"]["self"]})


@router.get(
    "",
    name="list_artifacts",
    response_model=ArtifactPage,
    summary="List artifacts (newest first, cursor pagination)",
    responses={**PROBLEM_RESPONSES},
)
def list_artifacts(
    request: Request,
    session: SessionDep,
    auth: ProjectDep,
    kind: Annotated[
        str | None,
        Query(
            description="checkpoint, dataset or job-output",
            json_schema_extra={"enum": list(ARTIFACT_KINDS)},
        ),
    ] = None,
    job_id: Annotated[uuid.UUID | None, Query(description="Outputs of this job")] = None,
    sha256: Annotated[
        str | None,
        Query(
            pattern="^[0-9a-f]{64}$",
            description="Only artifacts with this content (hex digest): a client asks before "
            "it uploads a file, and skips the upload when its project already has it.",
        ),
    ] = None,
    page_size: Annotated[int | None, Query(ge=1)] = None,
    page_token: Annotated[str | None, Query()] = None,
) -> JSONResponse:
    """The caller's artifacts matching the filters."""
    if kind is not None and kind not in ARTIFACT_KINDS:
        loc: list[str | int] = ["query", "kind"]
        raise validation_problem(
            [
                {
                    "field": "query.kind",
                    "loc": loc,
                    "message": f"unknown kind {kind!r}; one of {list(ARTIFACT_KINDS)}",
                    "type": "enum",
                }
            ]
        )
    settings = request.app.state.settings
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    items, token = service.list_artifacts(
        session,
        auth.project_id,
        kind=kind,
        job_id=job_id,
        sha256=sha256,
        page_size=size,
        page_token=page_token,
        preview=settings.artifact_tensor_preview,
    )
    return JSONResponse({"items": items, "next_page_token": token})


@router.get(
    "/{artifact_id}",
    name="get_artifact",
    response_model=ArtifactOut,
    summary="Artifact metadata: kind, sha256, size, tensors",
    responses={**PROBLEM_RESPONSES},
)
def get_artifact(
    request: Request, artifact_id: uuid.UUID, session: SessionDep, auth: ProjectDep
) -> JSONResponse:
    """The artifact (404 for an unknown id or another project's): its first tensors by name
    (``tensor_count`` in all; ``links.tensors`` pages through every one)."""
    preview = request.app.state.settings.artifact_tensor_preview
    return JSONResponse(service.get_artifact(session, auth.project_id, artifact_id, preview))


@router.get(
    "/{artifact_id}/tensors",
    name="list_artifact_tensors",
    response_model=TensorPage,
    summary="Every tensor of an artifact (name, dtype, shape), by name, paged",
    responses={**PROBLEM_RESPONSES},
)
def list_artifact_tensors(
    request: Request,
    artifact_id: uuid.UUID,
    session: SessionDep,
    auth: ProjectDep,
    page_size: Annotated[int | None, Query(ge=1)] = None,
    page_token: Annotated[str | None, Query()] = None,
) -> JSONResponse:
    """A page of the artifact's tensors in byte order of their names; follow
    ``next_page_token``. An artifact not read yet (a ``file://`` one) has none."""
    settings = request.app.state.settings
    size = min(page_size or settings.max_page_size, settings.max_page_size)
    return JSONResponse(
        service.list_tensors(
            session, auth.project_id, artifact_id, page_size=size, page_token=page_token
        )
    )


@router.get(
    "/{artifact_id}/metadata",
    name="list_artifact_metadata",
    response_model=MetadataPage,
    summary="Every safetensors __metadata__ entry of an artifact (key, value), by key, paged",
    responses={**PROBLEM_RESPONSES},
)
def list_artifact_metadata(
    request: Request,
    artifact_id: uuid.UUID,
    session: SessionDep,
    auth: ProjectDep,
    page_size: Annotated[int | None, Query(ge=1)] = None,
    page_token: Annotated[str | None, Query()] = None,
) -> JSONResponse:
    """A page of the artifact's metadata in byte order of the keys, values in full (the whole
    metadata is at most CURVPLAN_MAX_SAFETENSORS_METADATA_BYTES); follow ``next_page_token``."""
    settings = request.app.state.settings
    size = min(page_size or settings.default_page_size, settings.max_page_size)
    return JSONResponse(
        service.list_metadata(
            session, auth.project_id, artifact_id, page_size=size, page_token=page_token
        )
    )


@router.get(
    "/{artifact_id}/content",
    name="get_artifact_content",
    summary="Download the safetensors bytes of a stored artifact",
    responses={
        **PROBLEM_RESPONSES,
        200: {"content": {"application/octet-stream": {}}, "description": "The file"},
    },
)
def get_artifact_content(
    request: Request, artifact_id: uuid.UUID, session: SessionDep, auth: ProjectDep
) -> FileResponse:
    """The blob itself (e.g. a job's per-sample losses); 409 for a uri artifact."""
    artifact = service.get_artifact(session, auth.project_id, artifact_id)
    if artifact["storage"] != "blob":
        raise Problem(
            409, "this artifact is a reference to a file, not a stored blob", title="Conflict"
        )
    sha256 = artifact["sha256"]
    assert sha256 is not None  # a blob row has its digest (the table's check constraint)
    path = blob_store(request).path_for(sha256)
    if not path.is_file():
        raise Problem(410, "the artifact's blob is missing from the store", title="Gone")
    filename = f"{artifact['name'] or artifact['id']}.safetensors".replace('"', "")
    return FileResponse(
        path,
        media_type="application/octet-stream",
        filename=filename,
        headers={"ETag": f'"{artifact["sha256"]}"'},
    )
