"""Checks on a safetensors header alone, run as soon as the header has arrived.

An upload names its ``kind`` before the file (a form field sent first, or ``?kind=``);
then everything that decides whether the file can be accepted — text PostgreSQL can
store, the declared size against the limit, the dtypes and tensors of the kind — is
known from the header, and a bad upload is refused before its body is read.
"""

from __future__ import annotations

from curvplan_core.artifacts.blobstore import BlobTooLarge
from curvplan_core.artifacts.checks import check_kind
from curvplan_core.artifacts.safetensors_format import InvalidSafetensors, SafetensorsInfo
from curvplan_core.storable import shown, storable_text


def check_storable(info: SafetensorsInfo) -> None:
    """Tensor names and ``__metadata__`` hold text PostgreSQL can store (no NUL, no lone
    surrogate); the error names the tensor escaped, so the answer itself stays valid JSON."""
    for name in info.tensors:
        if not storable_text(name):
            raise InvalidSafetensors(
                "tensor names must not contain NUL or unpaired surrogate characters", shown(name)
            )
    for key, value in info.metadata.items():
        if not (storable_text(key) and storable_text(value)):
            raise InvalidSafetensors(
                f"__metadata__ entry {shown(key)!r} holds NUL or unpaired surrogate characters"
            )


def check_header(kind: str, info: SafetensorsInfo, declared_bytes: int, limit: int | None) -> None:
    """Everything the header alone decides: storable text, size within ``limit``, the kind."""
    check_storable(info)
    if limit is not None and declared_bytes > limit:
        raise BlobTooLarge(limit)
    check_kind(kind, info)
