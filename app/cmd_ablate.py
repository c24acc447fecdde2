"""`gastric-fl ablate` (not yet implemented)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `ablate` subcommand to `app`."""

    @app.command("ablate")
    def ablate() -> None:
        """Not yet implemented."""
        typer.echo("gastric-fl ablate is not implemented yet", err=True)
        raise typer.Exit(1)
