"""The ``curvplan`` command line.

Sub-commands live in :mod:`curvplan.commands`, one module per area, each
exposing ``register(app)``. This module never imports torch: commands that need
the curvature engine import it inside the command body.
"""

from __future__ import annotations

import typer

from curvplan.commands import agent, client, command_group, engine, service, worker

app = command_group(
    name="curvplan",
    help="Data-budgeting planner for Transformers: curvature at w*, sample and batch sizes.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from curvplan import __version__

        typer.echo(f"curvplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed curvplan version and exit.",
    ),
) -> None:
    """Data-budgeting planner for Transformers: curvature at w*, sample and batch sizes."""


service.register(app)
worker.register(app)
engine.register(app)
client.register(app)
agent.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
