"""Open and validate a ``file://`` artifact: regular files only, never blocking.

A path a project registered could name a FIFO (``open`` would block until a writer
comes, forever), a character device (``/dev/zero`` never ends) or a directory. The file
is opened with ``O_NONBLOCK`` (so opening a FIFO returns at once), checked with
``fstat`` to be a regular file, and only then read.
"""

from __future__ import annotations

import os
import stat

from curvplan_core.artifacts.safetensors_format import (
    MAX_HEADER_BYTES,
    MAX_TENSORS,
    SafetensorsInfo,
    SafetensorsValidator,
)


class NotARegularFile(OSError):
    """The path exists but is a FIFO, a device, a socket or a directory."""


def open_regular(path: str) -> int:
    """A read-only descriptor of ``path`` if it is a regular file (caller closes it)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def validate_regular_file(
    path: str,
    chunk_size: int = 1 << 20,
    *,
    max_header_bytes: int = MAX_HEADER_BYTES,
    max_tensors: int = MAX_TENSORS,
) -> SafetensorsInfo:
    """Validate the safetensors file at ``path``, which must be a regular file, under the
    given header limits (a worker passes the service's ``CURVPLAN_MAX_SAFETENSORS_*``)."""
    validator = SafetensorsValidator(max_header_bytes=max_header_bytes, max_tensors=max_tensors)
    with os.fdopen(open_regular(path), "rb") as fh:
        while chunk := fh.read(chunk_size):
            validator.feed(chunk)
    return validator.finish()
