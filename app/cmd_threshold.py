"""`gastric-fl threshold`: save a hospital's operating threshold into its model bundle (`app.operating`).

``--value T`` sets it by hand; ``--sensitivity S`` picks the highest threshold that reaches sensitivity ``S`` on the
hospital's validation split (its test split, labelled optimistic, when it has none). ``--by`` and ``--reason`` go
with the old and new value into the card's ``threshold_history``. Afterwards every page of the dashboard, the
HTML report, ``report`` and ``predict`` call tiles and slides at it, and say where it came from.
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the `threshold` subcommand to `app`."""

    @app.command("threshold")
    def threshold(
        run: Path = typer.Argument(..., help="The run directory (gastric-fl train output)."),
        hospital: int = typer.Option(..., "--hospital", help="The hospital whose bundle gets the threshold."),
        value: float | None = typer.Option(None, "--value", help="The threshold, strictly between 0 and 1."),
        sensitivity: float | None = typer.Option(
            None,
            "--sensitivity",
            help="Instead: the highest threshold reaching this sensitivity on the validation split (the test split, "
            "said optimistic, when the hospital has none).",
        ),
        by: str = typer.Option("", "--by", help="Who decides (kept in the card's threshold history; default: you)."),
        reason: str = typer.Option("", "--reason", help="Why (kept in the card's threshold history)."),
    ) -> None:
        """Save a hospital's operating threshold (by hand, or from a sensitivity floor) into its model card."""
        from app import operating
        from app.errors import DashboardError
        from models.bundle import MAX_BY, MAX_REASON, note_problem

        for flag, text, limit in (("--by", by, MAX_BY), ("--reason", reason, MAX_REASON)):
            problem = note_problem(flag, text.strip(), limit)  # echoed below and kept in the card: one printable line
            if problem is not None:
                raise DashboardError(problem)

        if (value is None) == (sensitivity is None):
            raise DashboardError("give exactly one of --value T (by hand) or --sensitivity S (from the floor)")
        folder = operating.bundle_folder(run, hospital)
        if value is not None:
            chosen, source, split = value, "set by hand", ""
        else:
            assert sensitivity is not None
            chosen, source, split = operating.from_floor(folder, sensitivity)
        import getpass

        who = by.strip() or getpass.getuser()
        card = operating.save(folder, chosen, source, split, by=who, reason=reason)
        from app.held_out import recall

        recall(folder, card.threshold)  # the held-out slides' calls at the new threshold (slides.csv)
        metrics = card.metrics
        sens, spec = metrics.get("sensitivity"), metrics.get("specificity")
        figures = ", ".join(
            f"{name} {float(v):.2f}" for name, v in (("sensitivity", sens), ("specificity", spec)) if v is not None
        )
        previous = card.threshold_history[-1]["from"]  # the change just saved
        because = f", because: {reason.strip()}" if reason.strip() else ""
        typer.echo(
            f"hospital {hospital}: threshold {card.threshold:.4g} saved in {folder / 'model.json'} ({source}), was "
            f"{previous:.4g}; by {who}{because}"
        )
        if figures:
            optimistic = " (chosen there too, so optimistic)" if split == "test" else ""
            typer.echo(f"on its test split at that threshold{optimistic}: {figures}")
