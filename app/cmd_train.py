"""`gastric-fl train` (not yet implemented)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `train` subcommand to `app`."""

    @app.command("train")
    def train() -> None:
        """Not yet implemented."""
        typer.echo("gastric-fl train is not implemented yet", err=True)
        raise typer.Exit(1)
