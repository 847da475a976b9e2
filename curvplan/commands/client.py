"""Client commands that talk to a running curvplan service: analyze, plan, jobs, report…"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the client commands to the top-level app."""
