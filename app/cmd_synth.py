"""`gastric-fl synth` (not yet implemented)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `synth` subcommand to `app`."""

    @app.command("synth")
    def synth() -> None:
        """Not yet implemented."""
        typer.echo("gastric-fl synth is not implemented yet", err=True)
        raise typer.Exit(1)
