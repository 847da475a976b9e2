"""CLI sub-command groups; each module exposes ``register(app: typer.Typer)``."""

from __future__ import annotations

from typing import Any

import typer


def command_group(**kwargs: Any) -> typer.Typer:
    """A Typer app whose help is printed as written: no rich markup, so ``curvplan[mlflow]``
    and ``[default: …]`` survive (rich would read the brackets as style tags and drop them)."""
    return typer.Typer(rich_markup_mode=None, **kwargs)
