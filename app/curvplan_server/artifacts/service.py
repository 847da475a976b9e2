"""Artifact rows (SQLAlchemy Core), always scoped to a project.

Another project's artifact is "not found" (404 on GET, 422 naming the field when a job
body refers to it), so ids do not leak across projects.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NotRequired, TypedDict, cast

from psycopg.types.json import Jsonb
from sqlalchemy import Row, Table, and_, literal_column, select, text, tuple_
from sqlalchemy.orm import Session

from curvplan.types.jobs import ArtifactReference
from curvplan.types.problems import FieldErrorEntry
from curvplan_core.artifacts.safetensors_format import SafetensorsSummary, TensorSummaryJson
from curvplan_server.artifacts.models import Artifact
from curvplan_server.paging import decode_page_token, encode_page_token, page_token_problem
from curvplan_server.problems import not_found, validation_problem

ARTIFACT = cast(Table, Artifact.__table__)
_COLUMNS = [
    ARTIFACT.c.id,
    ARTIFACT.c.kind,
    ARTIFACT.c.name,
    ARTIFACT.c.storage,
    ARTIFACT.c.sha256,
    ARTIFACT.c.size_bytes,
    ARTIFACT.c.uri,
    ARTIFACT.c.job_id,
    ARTIFACT.c.created_at,
]
#: Tensors are listed by name in byte order (COLLATE "C"): the same order on every server.
_TENSOR_COUNT: Any = literal_column(
    "CASE WHEN jsonb_typeof(artifact.tensors -> 'tensors') = 'object' THEN coalesce("
    "(artifact.tensors ->> 'tensor_count')::bigint, "
    "(SELECT count(*) FROM jsonb_object_keys(artifact.tensors -> 'tensors'))) END"
).label("tensor_count")
#: An artifact's read and list show the first metadata entries by key, each value cut
#: (a header's __metadata__ may hold up to CURVPLAN_MAX_SAFETENSORS_METADATA_BYTES, and 40
#: artifacts of 9.3 MB each made one list page 374 MB); ``links.metadata`` pages through all.
METADATA_PREVIEW = 20
METADATA_VALUE_CHARS = 200
_METADATA_OBJECT = (
    "CASE WHEN jsonb_typeof(artifact.tensors -> 'metadata') = 'object' "
    "THEN artifact.tensors -> 'metadata' END"
)
_METADATA_COUNT: Any = literal_column(
    f"(SELECT count(*) FROM jsonb_object_keys({_METADATA_OBJECT}))"
).label("metadata_count")
_METADATA: Any = literal_column(
    "(SELECT jsonb_object_agg(m.key, m.value) FROM (SELECT key, "
    f"left(value, {METADATA_VALUE_CHARS}) AS value FROM jsonb_each_text({_METADATA_OBJECT}) "
    f'ORDER BY key COLLATE "C" LIMIT {METADATA_PREVIEW}) m)'
).label("metadata")
_METADATA_CUT: Any = literal_column(
    f"EXISTS (SELECT 1 FROM jsonb_each_text({_METADATA_OBJECT}) "
    f"WHERE length(value) > {METADATA_VALUE_CHARS})"
).label("metadata_cut")


def _preview(limit: int) -> Any:
    """The first ``limit`` tensors (name → dtype and shape) of each row, by name."""
    return literal_column(
        "(SELECT jsonb_object_agg(t.key, t.value) FROM (SELECT key, value FROM "
        "jsonb_each(CASE WHEN jsonb_typeof(artifact.tensors -> 'tensors') = 'object' "
        "THEN artifact.tensors -> 'tensors' END) "
        f'ORDER BY key COLLATE "C" LIMIT {int(limit)}) t)'
    ).label("tensor_preview")


def summary_columns(preview: int) -> list[Any]:
    """What a read selects: the row, and a bounded summary of its tensors."""
    return [
        *_COLUMNS,
        _TENSOR_COUNT,
        _METADATA,
        _METADATA_COUNT,
        _METADATA_CUT,
        _preview(preview),
    ]


class ArtifactLinksJson(TypedDict):
    self: str
    tensors: str
    metadata: str
    content: NotRequired[str]


class ArtifactJson(TypedDict):
    """An artifact as the API answers it: :class:`curvplan.types.artifacts.ArtifactOut`'s JSON."""

    id: str
    kind: str
    name: str | None
    storage: str
    sha256: str | None
    size: int | None
    uri: str | None
    tensor_count: int | None
    tensors: dict[str, TensorSummaryJson] | None
    tensors_truncated: bool
    metadata: dict[str, str] | None
    metadata_count: int | None
    metadata_truncated: bool
    job_id: str | None
    created_at: str
    links: ArtifactLinksJson


class TensorEntryJson(TypedDict):
    name: str
    dtype: str
    shape: list[int]


class TensorPageJson(TypedDict):
    """:class:`curvplan.types.artifacts.TensorPage`'s JSON."""

    items: list[TensorEntryJson]
    next_page_token: str | None


class MetadataEntryJson(TypedDict):
    key: str
    value: str


class MetadataPageJson(TypedDict):
    """:class:`curvplan.types.artifacts.MetadataPage`'s JSON."""

    items: list[MetadataEntryJson]
    next_page_token: str | None


def artifact_to_json(row: Row[Any] | Any) -> ArtifactJson:
    """The API representation of an artifact row (see ``curvplan.types.artifacts.ArtifactOut``).

    ``tensors`` holds the first tensors by name (``CURVPLAN_ARTIFACT_TENSOR_PREVIEW``);
    ``tensor_count`` says how many there are, ``links.tensors`` pages through them all.
    """
    m = row._mapping
    artifact_id = str(m["id"])
    count = m["tensor_count"]
    preview = m["tensor_preview"] if count is not None else None
    out: ArtifactJson = {
        "id": artifact_id,
        "kind": m["kind"],
        "name": m["name"],
        "storage": m["storage"],
        "sha256": m["sha256"],
        "size": m["size_bytes"],
        "uri": m["uri"],
        "tensor_count": count,
        "tensors": (preview or {}) if count is not None else None,
        "tensors_truncated": count is not None and count > len(preview or {}),
        "metadata": (m["metadata"] or {}) if m["tensor_count"] is not None else None,
        "metadata_count": m["metadata_count"] if m["tensor_count"] is not None else None,
        "metadata_truncated": bool(m["metadata_count"] > METADATA_PREVIEW or m["metadata_cut"]),
        "job_id": str(m["job_id"]) if m["job_id"] is not None else None,
        "created_at": m["created_at"].isoformat(),
        "links": {
            "self": f"/v1/artifacts/{artifact_id}",
            "tensors": f"/v1/artifacts/{artifact_id}/tensors",
            "metadata": f"/v1/artifacts/{artifact_id}/metadata",
        },
    }
    if m["storage"] == "blob":
        out["links"]["content"] = f"/v1/artifacts/{artifact_id}/content"
    return out


@dataclass(frozen=True, slots=True)
class Stored:
    """An inserted (or already present, for a re-upload) artifact."""

    artifact: ArtifactJson
    created: bool


def insert_blob_artifact(
    session: Session,
    project_id: uuid.UUID,
    *,
    kind: str,
    name: str | None,
    sha256: str,
    size: int,
    summary: SafetensorsSummary,
    preview: int = 100,
) -> Stored:
    """Insert an uploaded blob's row; the same content uploaded again returns the first row."""
    driver = session.connection().connection.driver_connection
    assert driver is not None
    raw = driver.execute(
        "INSERT INTO artifact (id, project_id, kind, name, storage, sha256, size_bytes, tensors) "
        "VALUES (%s, %s, %s, %s, 'blob', %s, %s, %s) "
        "ON CONFLICT (project_id, kind, sha256) WHERE job_id IS NULL AND storage = 'blob' "
        "DO NOTHING RETURNING id",
        (uuid.uuid4(), project_id, kind, name, sha256, size, Jsonb(summary)),
    ).fetchone()
    columns = summary_columns(preview)
    if raw is not None:
        row = session.execute(select(*columns).where(ARTIFACT.c.id == raw[0])).one()
        return Stored(artifact_to_json(row), True)
    existing = session.execute(
        select(*columns).where(
            ARTIFACT.c.project_id == project_id,
            ARTIFACT.c.kind == kind,
            ARTIFACT.c.sha256 == sha256,
            ARTIFACT.c.job_id.is_(None),
            ARTIFACT.c.storage == "blob",
        )
    ).one()
    return Stored(artifact_to_json(existing), False)


def insert_uri_artifact(
    session: Session, project_id: uuid.UUID, *, kind: str, uri: str, name: str | None
) -> ArtifactJson:
    """Register a file the workers can read; it is hashed and validated when a job uses it."""
    row = session.execute(
        ARTIFACT.insert()
        .values(
            id=uuid.uuid4(), project_id=project_id, kind=kind, name=name, storage="uri", uri=uri
        )
        .returning(ARTIFACT.c.id)
    ).scalar_one()
    return artifact_to_json(
        session.execute(select(*summary_columns(0)).where(ARTIFACT.c.id == row)).one()
    )


def get_artifact(
    session: Session, project_id: uuid.UUID, artifact_id: uuid.UUID, preview: int = 100
) -> ArtifactJson:
    """The artifact, or a 404 problem (also for another project's artifact)."""
    row = session.execute(
        select(*summary_columns(preview)).where(
            ARTIFACT.c.id == artifact_id, ARTIFACT.c.project_id == project_id
        )
    ).first()
    if row is None:
        raise not_found("artifact")
    return artifact_to_json(row)


def _header_entries_page(
    session: Session,
    project_id: uuid.UUID,
    artifact_id: uuid.UUID,
    *,
    section: str,
    each: str,
    cursor: str,
    page_size: int,
    page_token: str | None,
) -> tuple[list[Any], str | None]:
    """A page of one object of the stored safetensors header (``section``: ``tensors`` or
    ``metadata``), its entries by key in byte order through ``each`` (``jsonb_each`` or
    ``jsonb_each_text``), and the next page's token. A header never changes, so a position is
    a stable cursor; the token names the artifact under ``cursor`` so that a token of one list
    or artifact is refused by another."""
    get_artifact(session, project_id, artifact_id, preview=0)  # 404 if not ours
    offset = 0
    if page_token:
        data = decode_page_token(page_token, ("o", cursor))
        if data[cursor] != str(artifact_id) or not data["o"].isdigit():
            raise page_token_problem("this page token was issued for another artifact")
        offset = int(data["o"])
    rows = session.execute(
        text(
            f"SELECT key, value FROM artifact, {each}(CASE WHEN jsonb_typeof(tensors -> "
            f"'{section}') = 'object' THEN tensors -> '{section}' END) "
            'WHERE artifact.id = :id ORDER BY key COLLATE "C" OFFSET :o LIMIT :n'
        ),
        {"id": artifact_id, "o": offset, "n": page_size + 1},
    ).all()
    token = None
    if len(rows) > page_size:
        token = encode_page_token({"o": str(offset + page_size), cursor: str(artifact_id)})
    return list(rows[:page_size]), token


def list_tensors(
    session: Session,
    project_id: uuid.UUID,
    artifact_id: uuid.UUID,
    *,
    page_size: int,
    page_token: str | None,
) -> TensorPageJson:
    """A page of the artifact's tensors by name (byte order) and the next page's token."""
    rows, token = _header_entries_page(
        session, project_id, artifact_id, section="tensors", each="jsonb_each", cursor="a",
        page_size=page_size, page_token=page_token,
    )  # fmt: skip
    items: list[TensorEntryJson] = [
        {"name": r.key, "dtype": r.value.get("dtype"), "shape": r.value.get("shape")} for r in rows
    ]
    return {"items": items, "next_page_token": token}


def list_metadata(
    session: Session,
    project_id: uuid.UUID,
    artifact_id: uuid.UUID,
    *,
    page_size: int,
    page_token: str | None,
) -> MetadataPageJson:
    """A page of the artifact's ``__metadata__`` entries by key (byte order), values in full,
    and the next page's token (the whole metadata is bounded by the upload limit)."""
    rows, token = _header_entries_page(
        session, project_id, artifact_id, section="metadata", each="jsonb_each_text",
        cursor="m", page_size=page_size, page_token=page_token,
    )  # fmt: skip
    return {"items": [{"key": r.key, "value": r.value} for r in rows], "next_page_token": token}


# --------------------------------------------------------------------------- listing
def _encode_token(created_at: datetime, artifact_id: uuid.UUID, fingerprint: str) -> str:
    return encode_page_token({"c": created_at.isoformat(), "i": str(artifact_id), "f": fingerprint})


def _decode_token(token: str, fingerprint: str) -> tuple[datetime, uuid.UUID]:
    """The cursor of a token we issued; anything else (crafted, damaged) is a 422."""
    data = decode_page_token(token, ("c", "i", "f"))
    try:
        created_at, artifact_id = datetime.fromisoformat(data["c"]), uuid.UUID(data["i"])
    except ValueError:
        raise page_token_problem() from None
    if created_at.tzinfo is None:
        raise page_token_problem()
    if data["f"] != fingerprint:
        raise page_token_problem("this page token was issued for other filters")
    return created_at, artifact_id


def list_artifacts(
    session: Session,
    project_id: uuid.UUID,
    *,
    kind: str | None,
    job_id: uuid.UUID | None,
    page_size: int,
    page_token: str | None,
    preview: int = 100,
    sha256: str | None = None,
) -> tuple[list[ArtifactJson], str | None]:
    """A page of the project's artifacts, newest first, and the next page's token."""
    fingerprint = f"{kind}|{job_id}" + (f"|{sha256}" if sha256 else "")
    conditions = [ARTIFACT.c.project_id == project_id]
    if kind is not None:
        conditions.append(ARTIFACT.c.kind == kind)
    if job_id is not None:
        conditions.append(ARTIFACT.c.job_id == job_id)
    if sha256 is not None:
        conditions.append(ARTIFACT.c.sha256 == sha256)
    if page_token:
        created_at, last_id = _decode_token(page_token, fingerprint)
        conditions.append(
            tuple_(ARTIFACT.c.created_at, ARTIFACT.c.id) < tuple_(created_at, last_id)
        )
    rows = session.execute(
        select(*summary_columns(preview))
        .where(and_(*conditions))
        .order_by(ARTIFACT.c.created_at.desc(), ARTIFACT.c.id.desc())
        .limit(page_size + 1)
    ).all()
    items = [artifact_to_json(r) for r in rows[:page_size]]
    token = None
    if len(rows) > page_size:
        last = rows[page_size - 1]
        token = _encode_token(last.created_at, last.id, fingerprint)
    return items, token


# --------------------------------------------------------------------------- job references
def check_references(
    session: Session, project_id: uuid.UUID, refs: Sequence[ArtifactReference]
) -> None:
    """422 naming every field whose artifact is missing, another project's, or of the wrong kind.

    A missing artifact and another project's artifact get the same message, so a job body
    cannot probe which ids exist elsewhere.
    """
    if not refs:
        return
    ids = sorted({r.artifact_id for r in refs})
    # FOR KEY SHARE until the job is committed: a concurrent DELETE /v1/artifacts/{id} waits
    # and then sees the queued job (docs/storage.md), or it wins and the row is not found.
    rows = session.execute(
        select(ARTIFACT.c.id, ARTIFACT.c.kind)
        .where(ARTIFACT.c.id.in_(ids), ARTIFACT.c.project_id == project_id)
        .with_for_update(read=True, key_share=True)
    ).all()
    kinds = {row.id: row.kind for row in rows}
    errors: list[FieldErrorEntry] = []
    for ref in refs:
        loc: list[str | int] = ["body", *ref.field]
        found = kinds.get(ref.artifact_id)
        if found is None:
            message = f"artifact {ref.artifact_id} not found in this project"
            error_type = "artifact_not_found"
        elif found != ref.kind:
            message = f"artifact {ref.artifact_id} is a {found}, expected a {ref.kind}"
            error_type = "artifact_kind"
        else:
            continue
        errors.append(
            {
                "field": ".".join(str(p) for p in loc),
                "loc": loc,
                "message": message,
                "type": error_type,
            }
        )
    if errors:
        raise validation_problem(errors)
