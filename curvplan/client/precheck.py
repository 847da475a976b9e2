"""What the client checks before it uploads anything: the job body against the contract, and
whether the service already holds a file's content.

- :func:`validate_job_body` validates a body with the same rules the service applies
  (``curvplan.types``: the job models and the finite-number rule), so ``--option nonsense=1``
  or a sweep ``--type bach`` fail with the service's 422 fields before gigabytes are sent.
  Files still to upload stand in as placeholder ids (:func:`placeholder_ids`).
- :func:`lookup_call` / :func:`stored_artifact` ask ``GET /v1/artifacts?kind=&sha256=`` for
  the file's digest: content the project already has is not uploaded again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from curvplan.client._common import Call
from curvplan.client.errors import ValidationFailedError
from curvplan.types.artifacts import ArtifactOut
from curvplan.types.finite import NON_FINITE_MESSAGE, NON_FINITE_TYPE, non_finite_in_json
from curvplan.types.jobs import CLIENT_JOB_CREATE_ADAPTER, JOB_KINDS
from curvplan.types.problems import FieldErrorEntry


def placeholder_ids(paths: Iterable[Path]) -> dict[Path, str]:
    """An artifact id for every file not uploaded yet (only for validating the body)."""
    return {path: str(uuid.uuid4()) for path in paths}


def _field(loc: list[str | int]) -> str:
    return ".".join(str(p) for p in loc)


def validate_job_body(body: Mapping[str, Any]) -> None:
    """Raise :class:`ValidationFailedError` (status 422, ``errors`` naming each field as the
    service would) when the service would refuse ``body`` by its contract."""
    raw = json.dumps(body)
    errors: list[FieldErrorEntry] = [
        {"field": _field(list(loc)), "loc": list(loc), "message": NON_FINITE_MESSAGE,
         "type": NON_FINITE_TYPE}
        for loc in non_finite_in_json(raw, prefix=("body",))
    ]  # fmt: skip
    if not errors:
        try:
            CLIENT_JOB_CREATE_ADAPTER.validate_json(raw)
        except ValidationError as exc:
            errors = [_field_error(e) for e in exc.errors(include_url=False, include_input=False)]
    if errors:
        raise ValidationFailedError(
            "invalid input (checked before any upload): "
            + ", ".join(sorted({e["field"] for e in errors})),
            status=422,
            title="Validation Failed",
            errors=errors,
        )


def _field_error(error: ErrorDetails) -> FieldErrorEntry:
    loc = [p for p in error["loc"] if not (isinstance(p, str) and ("[" in p or "function-" in p))]
    if error["type"] in ("union_tag_not_found", "union_tag_invalid"):
        loc = ["kind"]
    elif loc and loc[0] in JOB_KINDS:  # the union member's tag
        loc = loc[1:]
    full: list[str | int] = ["body", *loc]
    return {"field": _field(full), "loc": full, "message": error["msg"], "type": error["type"]}


def lookup_call(kind: str, sha256: str) -> Call:
    """``GET /v1/artifacts`` for this project's upload of ``kind`` with this content."""
    params = [("kind", kind), ("sha256", sha256), ("page_size", "1")]
    return Call("GET", "/v1/artifacts", params=params)


def stored_artifact(page: Any, sha256: str) -> ArtifactOut | None:
    """The stored upload in a lookup's answer, if it holds this content (a service that does
    not know the ``sha256`` filter lists other artifacts: they are not taken for it)."""
    for item in (page or {}).get("items") or []:
        if item.get("sha256") == sha256 and item.get("storage") == "blob":
            return ArtifactOut.model_validate(item)
    return None
