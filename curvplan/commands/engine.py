"""Curvature-engine commands that run without the service: curvature, example."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the engine commands to the top-level app."""
