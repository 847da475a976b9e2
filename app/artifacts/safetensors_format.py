"""Streaming validation of safetensors files, without torch and without unpickling.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
unsigned header length N, then N bytes of UTF-8 JSON mapping tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional ``__metadata__``
object of string → string), then the byte buffer. Offsets are relative to the start of the
buffer; the tensors must cover the buffer exactly, without holes or overlaps.

:class:`SafetensorsValidator` is fed the upload chunk by chunk, so a client's file is checked
while it streams to disk and never needs to fit in memory. Anything that is not a well-formed
safetensors file — a pickle, a zip (``torch.save``), a truncated file, a header whose offsets
or shapes lie — is refused with :class:`InvalidSafetensors`, which names what is wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

#: Bytes per element of every dtype the safetensors format defines.
DTYPE_SIZES: dict[str, float] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

#: The reference implementation refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100_000_000

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


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as declared by a validated header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]


@dataclass
class SafetensorsInfo:
    """What a validated file declares: its tensors, metadata and sizes."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    header_bytes: int = 0
    total_bytes: int = 0

    def to_json(self) -> dict:
        """A JSON-able summary (stored with the artifact row)."""
        return {
            "tensors": {
                t.name: {"dtype": t.dtype, "shape": list(t.shape)} for t in self.tensors.values()
            },
            "metadata": self.metadata,
            "header_bytes": self.header_bytes,
            "total_bytes": self.total_bytes,
        }


def parse_header(header: bytes) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Validate a header's JSON; return the tensors, the metadata and the buffer size it implies.

    Checks every rule of the format: known dtypes, non-negative integer shapes, offsets whose
    span equals ``prod(shape) * itemsize``, and offsets that tile the buffer without holes or
    overlaps.
    """
    try:
        decoded = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidSafetensors(f"header is not valid UTF-8 JSON ({exc})") from None
    except RecursionError:
        raise InvalidSafetensors("header JSON is nested too deeply") from None
    if not isinstance(decoded, dict):
        raise InvalidSafetensors("header must be a JSON object")

    metadata_raw = decoded.pop("__metadata__", {})
    if not isinstance(metadata_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata_raw.items()
    ):
        raise InvalidSafetensors("__metadata__ must map strings to strings")

    tensors: dict[str, TensorInfo] = {}
    for name, entry in decoded.items():
        tensors[name] = _parse_tensor_entry(name, entry)

    spans = sorted((t.data_offsets, t.name) for t in tensors.values())
    cursor = 0
    for (begin, end), name in spans:
        if begin != cursor:
            problem = "overlaps another tensor" if begin < cursor else "leaves a hole before it"
            raise InvalidSafetensors(f"data_offsets {problem}", name)
        cursor = end
    return tensors, dict(metadata_raw), cursor


def _parse_tensor_entry(name: str, entry: object) -> TensorInfo:
    if not isinstance(entry, dict):
        raise InvalidSafetensors("entry must be an object", name)
    dtype = entry.get("dtype")
    if dtype not in DTYPE_SIZES:
        raise InvalidSafetensors(f"unknown dtype {dtype!r}", name)
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidSafetensors("shape must be a list of non-negative integers", name)
    offsets = entry.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise InvalidSafetensors("data_offsets must be [begin, end] with 0 <= begin <= end", name)
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if offsets[1] - offsets[0] != expected:
        raise InvalidSafetensors(
            f"data_offsets span {offsets[1] - offsets[0]} bytes but {dtype}{shape} needs "
            f"{int(expected)}",
            name,
        )
    return TensorInfo(name, dtype, tuple(shape), (offsets[0], offsets[1]))


class SafetensorsValidator:
    """Incremental validator: ``feed`` the bytes as they arrive, then ``finish``.

    Memory stays bounded by the header size (≤ :data:`MAX_HEADER_BYTES`): the data buffer is
    only counted, never kept.
    """

    def __init__(self, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self._max_header = max_header_bytes
        self._prefix = bytearray()
        self._header_len: int | None = None
        self._info: SafetensorsInfo | None = None
        self._buffer_expected = 0
        self._seen = 0

    def feed(self, chunk: bytes) -> None:
        """Consume the next chunk; raise :class:`InvalidSafetensors` as soon as it is provable."""
        self._seen += len(chunk)
        if self._info is not None:
            self._check_not_too_long()
            return
        self._prefix.extend(chunk)
        if self._header_len is None and len(self._prefix) >= 8:
            self._header_len = self._read_header_length(bytes(self._prefix[:8]))
        if self._header_len is not None and len(self._prefix) >= 8 + self._header_len:
            header = bytes(self._prefix[8 : 8 + self._header_len])
            tensors, metadata, buffer_len = parse_header(header)
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
        """Check that the file is complete and return what it declares."""
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
    """Validate a safetensors file on disk (used for ``file://`` artifacts when a job starts)."""
    validator = SafetensorsValidator()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            validator.feed(chunk)
    return validator.finish()
