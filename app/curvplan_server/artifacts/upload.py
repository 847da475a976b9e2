"""Streaming ``multipart/form-data`` upload: fields ``file`` (the safetensors file) and ``kind``.

The request body is parsed incrementally with python-multipart's ``MultipartParser``:
the ``file`` part goes straight to a :class:`~curvplan_core.artifacts.blobstore.BlobWriter` (temp
file, sha256, safetensors validation chunk by chunk); the small text fields are kept.
Nothing but one chunk and the safetensors header is ever held in memory.
"""

from __future__ import annotations

from collections.abc import Callable

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from curvplan_core.artifacts.blobstore import BlobWriter

FILE_FIELD = "file"
TEXT_FIELDS = ("kind", "name")
MAX_TEXT_FIELD_BYTES = 1024


class UploadFormError(ValueError):
    """The form is malformed or has a missing/unknown/oversized field (``field`` names it)."""

    def __init__(self, message: str, field: str | None = None, status: int = 422) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of a Content-Type header, or UploadFormError (400)."""
    media, params = parse_options_header(content_type)
    if media != b"multipart/form-data":
        raise UploadFormError("expected multipart/form-data", status=415)
    boundary = params.get(b"boundary")
    if not boundary:
        raise UploadFormError("multipart/form-data without a boundary parameter", status=400)
    return boundary


class UploadForm:
    """Feed the raw body with :meth:`write`, then :meth:`close`; read ``fields`` and ``writer``."""

    def __init__(self, boundary: bytes, open_writer: Callable[[], BlobWriter]) -> None:
        self._open_writer = open_writer
        self.writer: BlobWriter | None = None
        self.filename: str | None = None
        self.fields: dict[str, str] = {}
        self._headers: dict[bytes, bytes] = {}
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._part: str | None = None
        self._text = bytearray()
        self._parser = MultipartParser(
            boundary,
            callbacks={
                "on_part_begin": self._on_part_begin,
                "on_header_field": self._on_header_field,
                "on_header_value": self._on_header_value,
                "on_header_end": self._on_header_end,
                "on_headers_finished": self._on_headers_finished,
                "on_part_data": self._on_part_data,
                "on_part_end": self._on_part_end,
                "on_end": self._on_end,
            },
        )
        self._complete = False

    # ----------------------------------------------------------------- feeding
    def write(self, chunk: bytes) -> None:
        """Parse the next chunk of the body (writes file bytes through to the blob writer)."""
        try:
            self._parser.write(chunk)
        except MultipartParseError as exc:
            raise UploadFormError(f"malformed multipart body: {exc}", status=400) from None

    def close(self) -> None:
        """The body ended: check that the form was complete and has its fields."""
        try:
            self._parser.finalize()
        except MultipartParseError as exc:
            raise UploadFormError(f"malformed multipart body: {exc}", status=400) from None
        if self._part is not None or not self._complete:
            raise UploadFormError("the multipart body ended in the middle of a part", status=400)
        if self.writer is None:
            raise UploadFormError("the form has no 'file' part", FILE_FIELD)
        if "kind" not in self.fields:
            raise UploadFormError("the form has no 'kind' field", "kind")

    # ----------------------------------------------------------------- callbacks
    def _on_part_begin(self) -> None:
        self._headers = {}
        self._part = None
        self._text = bytearray()

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field = bytearray()
        self._header_value = bytearray()

    def _on_headers_finished(self) -> None:
        disposition, params = parse_options_header(self._headers.get(b"content-disposition"))
        name = params.get(b"name")
        if disposition != b"form-data" or name is None:
            raise UploadFormError(
                "a part has no Content-Disposition: form-data; name=…", status=400
            )
        part = name.decode("utf-8", "replace")
        if part == FILE_FIELD:
            if self.writer is not None:
                raise UploadFormError("the form has more than one 'file' part", FILE_FIELD)
            filename = params.get(b"filename")
            self.filename = filename.decode("utf-8", "replace") if filename else None
            self.writer = self._open_writer()
        elif part in TEXT_FIELDS:
            if part in self.fields:
                raise UploadFormError(f"the form has more than one {part!r} field", part)
        else:
            raise UploadFormError(
                f"unknown form field {part!r}; expected {FILE_FIELD!r}, "
                + ", ".join(repr(f) for f in TEXT_FIELDS),
                part,
            )
        self._part = part

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part == FILE_FIELD:
            assert self.writer is not None
            self.writer.write(data[start:end])
            return
        self._text += data[start:end]
        if len(self._text) > MAX_TEXT_FIELD_BYTES:
            raise UploadFormError(
                f"field {self._part!r} is longer than {MAX_TEXT_FIELD_BYTES} bytes", self._part
            )

    def _on_part_end(self) -> None:
        if self._part in TEXT_FIELDS:
            try:
                self.fields[self._part] = self._text.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise UploadFormError(f"field {self._part!r} is not UTF-8", self._part) from None
        self._part = None

    def _on_end(self) -> None:
        self._complete = True
