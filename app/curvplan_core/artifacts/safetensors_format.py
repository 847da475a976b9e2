"""Safetensors artifacts: an early streaming check, then the ``safetensors`` library itself.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
unsigned header length N, then N bytes of UTF-8 JSON mapping tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional ``__metadata__``
object of string → string), then the byte buffer.

Two stages, so that the rules of the format live in one place, the reference implementation:

- :class:`SafetensorsValidator` is fed the upload chunk by chunk while it streams to disk. It
  refuses a pickle, a zip (``torch.save``) or an absurd header length from the first 8 bytes,
  reads the header once it has arrived (tensor names, dtypes, shapes, metadata and the file
  size it declares, for the checks that need only the header) and refuses a file that runs
  past its declared size, so a bad upload is not read to the end.
- :func:`check_file` opens the complete file with ``safetensors.safe_open`` (numpy framework:
  no torch; the header is parsed and checked, no tensor is loaded): every dtype, shape, offset
  and coverage rule is the library's, so a file the installed ``safetensors`` reads is
  accepted (C64, F8_E4M3FNUZ, F8_E8M0, …) and one it refuses is refused with its reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from safetensors import SafetensorError, safe_open

#: The reference implementation refuses headers above 100 MB. We accept far less by default
#: (``CURVPLAN_MAX_SAFETENSORS_HEADER_BYTES``): the header is held and parsed in the API
#: process, and 10 MB already lists ~140,000 tensors (real checkpoints list a few thousand).
MAX_HEADER_BYTES = 10_000_000
#: Tensors one header may list (``CURVPLAN_MAX_SAFETENSORS_TENSORS``).
MAX_TENSORS = 100_000
#: Bytes of ``__metadata__`` (keys and values, UTF-8) one header may carry
#: (``CURVPLAN_MAX_SAFETENSORS_METADATA_BYTES``): real files carry a few keys ("format": "pt");
#: the metadata is stored with the artifact and read back through a paged endpoint.
MAX_METADATA_BYTES = 1_048_576
#: A declared length above this is no header at all (the reference implementation's bound):
#: the first bytes of some other format, reported as such rather than as "too large".
MAX_PLAUSIBLE_HEADER_BYTES = 100_000_000

_PICKLE_OR_ZIP_HINTS = (
    (b"PK\x03\x04", "a zip archive (torch.save output); only safetensors is accepted"),
    (b"\x80", "a Python pickle; pickles are never loaded, only safetensors is accepted"),
)


class InvalidSafetensors(ValueError):
    """The bytes are not a valid safetensors file; ``reason`` says why, ``tensor`` names one."""

    def __init__(self, reason: str, tensor: str | None = None) -> None:
        super().__init__(reason if tensor is None else f"tensor {tensor!r}: {reason}")
        self.reason = reason
        self.tensor = tensor


class MetadataTooLarge(InvalidSafetensors):
    """The ``__metadata__`` is larger than the service accepts (a 413, like the header)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the safetensors __metadata__ holds {size} bytes; this service accepts at most {limit}"
        )
        self.size = size
        self.limit = limit


class HeaderTooLarge(InvalidSafetensors):
    """The header is longer than the service accepts (a 413: the limit is the service's)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(
            f"the safetensors header is {length} bytes; this service accepts at most {limit}"
        )
        self.length = length
        self.limit = limit


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as declared by a validated header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]


class TensorSummaryJson(TypedDict):
    """One tensor of a stored header summary."""

    dtype: str
    shape: list[int]


class SafetensorsSummary(TypedDict):
    """What the artifact row keeps of a validated header (its ``tensors`` column)."""

    tensors: dict[str, TensorSummaryJson]
    tensor_count: int
    metadata: dict[str, str]
    header_bytes: int
    total_bytes: int


@dataclass
class SafetensorsInfo:
    """What a validated file declares: its tensors, metadata and sizes."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    header_bytes: int = 0
    total_bytes: int = 0

    def to_json(self) -> SafetensorsSummary:
        """A JSON-able summary (stored with the artifact row)."""
        return {
            "tensors": {
                t.name: {"dtype": t.dtype, "shape": list(t.shape)} for t in self.tensors.values()
            },
            "tensor_count": len(self.tensors),
            "metadata": self.metadata,
            "header_bytes": self.header_bytes,
            "total_bytes": self.total_bytes,
        }


def parse_header(
    header: bytes, max_tensors: int = MAX_TENSORS, max_metadata_bytes: int = MAX_METADATA_BYTES
) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Read a header's JSON: the tensors, the metadata and the buffer size it declares.

    More than ``max_tensors`` entries is refused before any entry is read; a ``__metadata__``
    of more than ``max_metadata_bytes`` (keys and values, UTF-8) is :class:`MetadataTooLarge`.

    Only the structure the early checks read is checked here (an object of entries with a
    dtype string, a shape and two offsets); whether dtypes, shapes and offsets are consistent
    is :func:`check_file`'s, i.e. the ``safetensors`` library's, to decide.
    """
    try:
        decoded = json.loads(header.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, or an integer of over 4,300 digits
        raise InvalidSafetensors(f"header is not valid UTF-8 JSON ({exc})") from None
    except RecursionError:
        raise InvalidSafetensors("header JSON is nested too deeply") from None
    if not isinstance(decoded, dict):
        raise InvalidSafetensors("header must be a JSON object")

    count = len(decoded) - ("__metadata__" in decoded)
    if count > max_tensors:
        raise InvalidSafetensors(
            f"the header lists {count} tensors; this service accepts at most {max_tensors} per file"
        )
    metadata_raw = decoded.pop("__metadata__", {})
    if not isinstance(metadata_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata_raw.items()
    ):
        raise InvalidSafetensors("__metadata__ must map strings to strings")
    metadata_size = sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in metadata_raw.items()
    )
    if metadata_size > max_metadata_bytes:
        raise MetadataTooLarge(metadata_size, max_metadata_bytes)

    tensors = {name: _parse_tensor_entry(name, entry) for name, entry in decoded.items()}
    buffer_len = max((t.data_offsets[1] for t in tensors.values()), default=0)
    return tensors, dict(metadata_raw), buffer_len


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_tensor_entry(name: str, entry: object) -> TensorInfo:
    if not isinstance(entry, dict):
        raise InvalidSafetensors("entry must be an object", name)
    dtype = entry.get("dtype")
    if not isinstance(dtype, str):
        raise InvalidSafetensors("dtype must be a string", name)
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise InvalidSafetensors("shape must be a list of non-negative integers", name)
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise InvalidSafetensors("data_offsets must be [begin, end] with 0 <= begin <= end", name)
    return TensorInfo(name, dtype, tuple(shape), (offsets[0], offsets[1]))


_LIBRARY_TENSOR = re.compile(r"tensor `([^`]*)`")
_LIBRARY_PREFIX = "Error while deserializing header: "


def check_file(path: str | Path) -> None:
    """Validate a complete file with the ``safetensors`` library (no tensor is loaded).

    Raises :class:`InvalidSafetensors` with the library's reason (and the tensor it names).
    """
    try:
        with safe_open(str(path), framework="numpy") as fh:
            fh.keys()
    except SafetensorError as exc:
        message = str(exc)
        reason = message.removeprefix(_LIBRARY_PREFIX)
        match = _LIBRARY_TENSOR.search(reason)
        raise InvalidSafetensors(reason, match.group(1) if match else None) from None


class SafetensorsValidator:
    """Incremental validator: ``feed`` the bytes as they arrive, then ``finish``.

    Memory stays bounded by the header size (≤ :data:`MAX_HEADER_BYTES`): the data buffer is
    only counted, never kept.
    """

    def __init__(
        self,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_tensors: int = MAX_TENSORS,
        max_metadata_bytes: int = MAX_METADATA_BYTES,
    ) -> None:
        self._max_header = max_header_bytes
        self._max_tensors = max_tensors
        self._max_metadata = max_metadata_bytes
        self._prefix = bytearray()
        self._header_len: int | None = None
        self._info: SafetensorsInfo | None = None
        self._buffer_expected = 0
        self._seen = 0
        #: Called with the declared header length as soon as the first 8 bytes have arrived,
        #: before the header itself is held; what it raises aborts the upload there.
        self.on_header_length: Callable[[int], None] | None = None

    def feed(self, chunk: bytes) -> None:
        """Consume the next chunk; raise :class:`InvalidSafetensors` as soon as it is provable."""
        self._seen += len(chunk)
        if self._info is not None:
            self._check_not_too_long()
            return
        self._prefix.extend(chunk)
        if self._header_len is None and len(self._prefix) >= 8:
            self._header_len = self._read_header_length(bytes(self._prefix[:8]))
            if self.on_header_length is not None:
                self.on_header_length(self._header_len)
        if self._header_len is not None and len(self._prefix) >= 8 + self._header_len:
            header = bytes(self._prefix[8 : 8 + self._header_len])
            tensors, metadata, buffer_len = parse_header(
                header, self._max_tensors, self._max_metadata
            )
            self._info = SafetensorsInfo(tensors, metadata, self._header_len)
            self._buffer_expected = buffer_len
            self._prefix = bytearray()  # drop the header copy; the buffer is only counted
            self._check_not_too_long()

    @property
    def header(self) -> SafetensorsInfo | None:
        """What the header declares, once it has arrived and parsed (else None)."""
        return self._info

    @property
    def declared_bytes(self) -> int:
        """The file size the header declares (valid once :attr:`header` is set)."""
        assert self._info is not None
        return 8 + self._info.header_bytes + self._buffer_expected

    def finish(self) -> SafetensorsInfo:
        """Check that the file has the size its header declares and return what it declares
        (then :func:`check_file` the stored file)."""
        if self._info is None:
            if self._seen == 0:
                raise InvalidSafetensors("the file is empty")
            raise InvalidSafetensors("truncated: the file ends inside its header")
        expected_total = 8 + self._info.header_bytes + self._buffer_expected
        if self._seen < expected_total:
            raise InvalidSafetensors(
                f"truncated: the header declares {expected_total} bytes but the file has "
                f"{self._seen}"
            )
        self._info.total_bytes = self._seen
        return self._info

    def _read_header_length(self, first8: bytes) -> int:
        length = int.from_bytes(first8, "little")
        if MAX_PLAUSIBLE_HEADER_BYTES >= length > self._max_header:
            raise HeaderTooLarge(length, self._max_header)
        if length < 2 or length > self._max_header:
            # Only an impossible length is blamed on a pickle/zip: a real header of 128 bytes
            # (or 384, …) also starts with 0x80.
            for magic, hint in _PICKLE_OR_ZIP_HINTS:
                if first8.startswith(magic):
                    raise InvalidSafetensors(f"not a safetensors file: it looks like {hint}")
            raise InvalidSafetensors(
                f"not a safetensors file: declared header length {length} is out of range"
            )
        return length

    def _check_not_too_long(self) -> None:
        assert self._info is not None
        expected_total = 8 + self._info.header_bytes + self._buffer_expected
        if self._seen > expected_total:
            raise InvalidSafetensors(
                f"the file has {self._seen - expected_total} bytes after the last tensor"
            )


def validate_file(path: str, chunk_size: int = 1 << 20) -> SafetensorsInfo:
    """Validate a safetensors file on disk (used for ``file://`` artifacts when a job starts):
    the early check while reading it, then the library's."""
    validator = SafetensorsValidator()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            validator.feed(chunk)
    info = validator.finish()
    check_file(path)
    return info
