"""curvplan: what users import and run — the HTTP client and the ``curvplan`` CLI.

``curvplan.Client`` / ``curvplan.AsyncClient`` and the ``CurvplanError`` family are
loaded on first use (PEP 562), so ``import curvplan`` stays cheap for the CLI. This
package never imports torch.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

try:
    __version__ = metadata.version("curvplan")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

if TYPE_CHECKING:
    from curvplan.client import (  # noqa: F401
        AsyncClient,
        Client,
        ConflictError,
        ConnectionFailedError,
        CurvplanError,
        NotFoundError,
        RetryPolicy,
        ValidationFailedError,
        WaitTimeoutError,
    )


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    client = importlib.import_module("curvplan.client")
    if name in client.__all__:
        return getattr(client, name)
    raise AttributeError(f"module 'curvplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    client = importlib.import_module("curvplan.client")

    return sorted([*globals(), *client.__all__])
