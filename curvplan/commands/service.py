"""Service commands: serve, worker, db, keys, dev."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the service commands to the top-level app."""
