"""CLI sub-command groups; each module exposes ``register(app: typer.Typer)``."""
