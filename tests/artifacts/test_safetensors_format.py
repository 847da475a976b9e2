"""Safetensors validation: the streaming early check, then the library itself (the oracle is
the reference implementation: what ``safetensors`` reads is accepted, what it refuses is not)."""

from __future__ import annotations

import io
import json
import pickle
import struct
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from curvplan_core.artifacts.safetensors_format import (
    InvalidSafetensors,
    SafetensorsValidator,
    check_file,
    validate_file,
)


def _validate(data: bytes, chunk: int = 7):
    """What an upload goes through: the streaming check, then the library on the stored file."""
    v = SafetensorsValidator()
    for i in range(0, len(data), chunk):
        v.feed(data[i : i + chunk])
    info = v.finish()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "upload.safetensors"
        path.write_bytes(data)
        check_file(path)
    return info


def _raw(header: dict, buffer: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + buffer


def _sample_file() -> bytes:
    rng = np.random.default_rng(0)
    return st_save(
        {
            "layers.0.attn.q.weight": rng.standard_normal((4, 3)).astype(np.float32),
            "inputs": rng.integers(0, 9, size=(5, 6)).astype(np.int64),
            "flag": np.array([True, False]),
        },
        metadata={"format": "pt"},
    )


@pytest.mark.parametrize("chunk", [1, 3, 64, 1 << 20])
def test_reference_file_accepted_with_declared_tensors(chunk: int) -> None:
    data = _sample_file()
    info = _validate(data, chunk)
    reference = st_load(data)
    assert set(info.tensors) == set(reference)
    for name, arr in reference.items():
        assert info.tensors[name].shape == arr.shape
    assert info.tensors["inputs"].dtype == "I64"
    assert info.metadata == {"format": "pt"}
    assert info.total_bytes == len(data)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 4), min_size=0, max_size=3), min_size=1, max_size=4),
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.int8, np.float16, np.uint8]),
    chunk=st.integers(1, 50),
)
def test_any_reference_file_roundtrips(shapes, dtype, chunk) -> None:
    tensors = {f"t{i}": np.zeros(s, dtype=dtype) for i, s in enumerate(shapes)}
    data = st_save(tensors)
    info = _validate(data, chunk)
    assert {n: t.shape for n, t in info.tensors.items()} == {n: a.shape for n, a in tensors.items()}


def test_pickle_is_refused_without_loading_it() -> None:
    class Boom:
        def __reduce__(self):  # would run on unpickling
            return (pytest.fail, ("unpickled!",))

    with pytest.raises(InvalidSafetensors, match="pickle"):
        _validate(pickle.dumps(Boom(), protocol=4))


def test_zip_checkpoint_is_refused() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", b"x")
    with pytest.raises(InvalidSafetensors, match="zip"):
        _validate(buf.getvalue())


def test_every_truncation_is_refused() -> None:
    data = _sample_file()
    for cut in range(len(data)):
        with pytest.raises(InvalidSafetensors):
            _validate(data[:cut])


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(InvalidSafetensors, match="after the last tensor"):
        _validate(_sample_file() + b"\0")


@pytest.mark.parametrize(
    ("header", "buffer", "match"),
    [
        (
            {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}},
            b"\0" * 12,
            "invalid shape, data type, or offset",
        ),
        ({"w": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "F99"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "shape"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "offset"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            b"\0" * 8,
            "invalid offset for tensor `b`",
        ),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4, "data_offsets"),
        ({"__metadata__": {"a": 1}}, b"", "__metadata__"),
    ],
)
def test_lying_headers_are_refused_as_the_library_refuses_them(header, buffer, match) -> None:
    data = _raw(header, buffer)
    with pytest.raises(InvalidSafetensors, match=match) as err:
        _validate(data)
    with pytest.raises(Exception):  # noqa: B017 (the oracle: the library refuses it too)
        st_load(data)
    if "offset for tensor `b`" in match:
        assert err.value.tensor == "b"


@pytest.mark.parametrize(
    ("dtype", "itemsize"), [("C64", 8), ("F8_E4M3FNUZ", 1), ("F8_E8M0", 1), ("F8_E5M2FNUZ", 1)]
)
def test_dtypes_the_library_reads_are_accepted(dtype: str, itemsize: int, tmp_path) -> None:
    header = {"w": {"dtype": dtype, "shape": [3], "data_offsets": [0, 3 * itemsize]}}
    data = _raw(header, b"\x01" * (3 * itemsize))
    path = tmp_path / "w.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="numpy") as fh:  # the oracle reads it
        assert list(fh.keys()) == ["w"]
    info = _validate(data, chunk=5)
    assert (info.tensors["w"].dtype, info.tensors["w"].shape) == (dtype, (3,))
    assert validate_file(str(path)).tensors["w"].dtype == dtype


def test_header_not_json_or_absurd_length() -> None:
    with pytest.raises(InvalidSafetensors, match="JSON"):
        _validate(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(InvalidSafetensors, match="out of range"):
        _validate(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(InvalidSafetensors, match="empty"):
        _validate(b"")


def test_validate_file_on_disk(tmp_path) -> None:
    path = tmp_path / "ok.safetensors"
    path.write_bytes(_sample_file())
    assert "inputs" in validate_file(str(path)).tensors


@pytest.mark.parametrize("header_len", [128, 384, 0x0480])
def test_header_length_starting_with_0x80_is_not_mistaken_for_a_pickle(header_len: int) -> None:
    """The first byte of the little-endian length is 0x80 for these lengths (pickle's magic)."""
    entry = {"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
    raw = json.dumps(entry).encode()
    raw += b" " * (header_len - len(raw))  # the format allows trailing spaces in the header
    data = struct.pack("<Q", len(raw)) + raw + b"\x01\x02"
    assert data[0] == 0x80
    assert set(st_load(data)) == {"w"}  # the reference implementation accepts it
    assert _validate(data).tensors["w"].shape == (2,)
