"""Worker command: ``curvplan worker --queues cpu,gpu``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the worker command to the top-level app."""
