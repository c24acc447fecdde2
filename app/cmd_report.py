"""`gastric-fl report` (not yet implemented)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `report` subcommand to `app`."""

    @app.command("report")
    def report() -> None:
        """Not yet implemented."""
        typer.echo("gastric-fl report is not implemented yet", err=True)
        raise typer.Exit(1)
