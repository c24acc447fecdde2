"""`gastric-fl prepare` (not yet implemented)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `prepare` subcommand to `app`."""

    @app.command("prepare")
    def prepare() -> None:
        """Not yet implemented."""
        typer.echo("gastric-fl prepare is not implemented yet", err=True)
        raise typer.Exit(1)
