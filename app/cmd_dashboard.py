"""`gastric-fl dashboard` (not yet implemented)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `dashboard` subcommand to `app`."""

    @app.command("dashboard")
    def dashboard() -> None:
        """Not yet implemented."""
        typer.echo("gastric-fl dashboard is not implemented yet", err=True)
        raise typer.Exit(1)
