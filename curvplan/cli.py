"""The ``curvplan`` command line.

Sub-commands live in :mod:`curvplan.commands`, one module per area, each
exposing ``register(app)``. This module never imports torch: commands that need
the curvature engine import it inside the command body.
"""

from __future__ import annotations

import typer

from curvplan.commands import client, engine, service, worker

app = typer.Typer(
    name="curvplan",
    help="Data-budgeting planner for Transformers: curvature at w*, sample and batch sizes.",
    no_args_is_help=True,
    add_completion=False,
)

service.register(app)
worker.register(app)
engine.register(app)
client.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
