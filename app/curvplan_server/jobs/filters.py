"""What the job list filters accept, stated in the OpenAPI document.

The filters are checked by hand (``service.parse_filters``, 422 naming the field); these
schema fragments say the same, so a client (or a schema-driven test) knows before sending:
``kind`` one of the kinds, ``status`` known statuses (comma-separated), ``tag`` ``key:value``
with a non-empty key, and no NUL character anywhere (PostgreSQL text cannot hold it).
"""

from __future__ import annotations

from pydantic import JsonValue

from curvplan.types.jobs import JOB_KINDS, JOB_STATUSES

_STATUS = "(" + "|".join(JOB_STATUSES) + ")"

KIND_FILTER_SCHEMA: dict[str, JsonValue] = {"enum": list(JOB_KINDS)}
STATUS_FILTER_SCHEMA: dict[str, JsonValue] = {
    "items": {"type": "string", "pattern": f"^ *{_STATUS} *(, *{_STATUS} *)*$"}
}
TAG_FILTER_SCHEMA: dict[str, JsonValue] = {
    "items": {"type": "string", "pattern": "^[^:\\u0000]+:[^\\u0000]*$"}
}
NAME_FILTER_SCHEMA: dict[str, JsonValue] = {"pattern": "^[^\\u0000]*$"}
