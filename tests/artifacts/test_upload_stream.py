"""The streaming multipart parser: any chunking gives the same blob; memory stays one chunk."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save as st_save

from curvplan_core.artifacts.blobstore import BlobStore
from curvplan_server.artifacts.upload import UploadForm, UploadFormError

BOUNDARY = b"----curvplan-test-boundary"


def multipart(parts: list[tuple[str, bytes, str | None]]) -> bytes:
    out = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"'
        if filename:
            disposition += f'; filename="{filename}"'
        out += b"--" + BOUNDARY + b"\r\n"
        out += f"Content-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
    return out + b"--" + BOUNDARY + b"--\r\n"


@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 20])
@pytest.mark.parametrize("file_first", [True, False])
def test_any_chunking_and_field_order_give_the_same_blob(
    chunk: int, file_first: bool, tmp_path: Path
) -> None:
    data = st_save({"w": np.arange(300, dtype=np.float32).reshape(30, 10)})
    parts = [("file", data, "w.safetensors"), ("kind", b"checkpoint", None)]
    body = multipart(parts if file_first else parts[::-1])
    store = BlobStore(tmp_path)
    form = UploadForm(BOUNDARY, lambda: store.writer())
    for i in range(0, len(body), chunk):
        form.write(body[i : i + chunk])
    form.close()
    assert form.fields == {"kind": "checkpoint"}
    assert form.filename == "w.safetensors"
    assert form.writer is not None
    info = form.writer.finish()
    assert info.tensors["w"].shape == (30, 10)
    assert form.writer.sha256 == hashlib.sha256(data).hexdigest()
    path = form.writer.commit()
    assert path.read_bytes() == data
    assert store.temp_files() == []


def test_body_ending_inside_a_part_is_refused(tmp_path: Path) -> None:
    data = st_save({"w": np.zeros(4, dtype=np.float32)})
    body = multipart([("kind", b"checkpoint", None), ("file", data, "w")])
    store = BlobStore(tmp_path)
    form = UploadForm(BOUNDARY, lambda: store.writer())
    form.write(body[:-30])  # inside the file part
    with pytest.raises(UploadFormError) as info:
        form.close()
    assert info.value.status == 400
    assert form.writer is not None
    form.writer.abort()
    assert store.temp_files() == []
