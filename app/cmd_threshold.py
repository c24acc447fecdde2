"""`gastric-fl threshold`: save a hospital's operating threshold into its model bundle (`app.operating`).

``--value T`` sets it by hand; ``--sensitivity S`` proposes the highest threshold at which the lower end of the 95%
interval of the sensitivity reaches ``S`` on the hospital's validation split (its test split, labelled optimistic, when
it has none; `app.evaluation.threshold.bounded_threshold`), and refuses, saying why, when none does. Before anything is
written it prints the direction of the change and what the new threshold gives on test (sensitivity, abnormal test
slides missed by name, false alarms; `app.operating.consequences_at`); ``--dry-run`` stops there. ``--undo`` restores
the value before the last change (`app.operating.undo`). ``--by`` and ``--reason`` go with the old and new value into
the card's ``threshold_history``. Afterwards every page of the dashboard, the HTML report, ``report`` and ``predict``
call tiles and slides at it, and say where it came from.
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
            help="Instead: the highest threshold reaching this sensitivity, on the lower end of its 95% interval, on "
            "the validation split (the test split, said optimistic, when the hospital has none).",
        ),
        undo: bool = typer.Option(False, "--undo", help="Instead: restore the threshold before the last change."),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="Print the change and what it gives on test, and write nothing."
        ),
        by: str = typer.Option("", "--by", help="Who decides (kept in the card's threshold history; default: you)."),
        reason: str = typer.Option("", "--reason", help="Why (kept in the card's threshold history)."),
    ) -> None:
        """Save a hospital's operating threshold (by hand, or from a sensitivity floor) into its model card."""
        from app import operating
        from app.errors import DashboardError
        from app.slide_view import read_card_json
        from models.bundle import MAX_BY, MAX_REASON, note_problem

        for flag, text, limit in (("--by", by, MAX_BY), ("--reason", reason, MAX_REASON)):
            problem = note_problem(flag, text.strip(), limit)  # echoed below and kept in the card: one printable line
            if problem is not None:
                raise DashboardError(problem)

        if sum((value is not None, sensitivity is not None, undo)) != 1:
            raise DashboardError("give exactly one of --value T (by hand), --sensitivity S (from the floor) or --undo")
        folder = operating.bundle_folder(run, hospital)
        card_json = read_card_json(folder)
        current = float(card_json.get("threshold", 0.5))
        split = ""
        if value is not None:
            chosen, source = value, "set by hand"
        elif sensitivity is not None:
            found, source, split = operating.proposal(folder, sensitivity)
            chosen = operating.card_threshold(found.threshold)
            typer.echo(f"hospital {hospital}: {operating.proposal_line(folder, found)}")
        else:
            history = card_json.get("threshold_history") or []
            if not history:
                raise DashboardError(f"{folder / 'model.json'}: its threshold was never changed, nothing to undo")
            chosen, source = float(history[-1]["from"]), "undo"
        typer.echo(f"hospital {hospital}: {operating.direction(current, chosen)}")
        found_test = operating.consequences_at(folder, chosen)
        if found_test is not None:
            optimistic = " (chosen there too, so optimistic)" if split == "test" else ""
            typer.echo(f"on its test split at {chosen:.4g}{optimistic}: {found_test.words}")
            if found_test.misses_abnormal_slide:
                typer.echo(
                    f"WARNING: at {chosen:.4g} it calls {len(found_test.missed)} of {found_test.abnormal_slides} "
                    f"abnormal test slides normal ({', '.join(found_test.missed)})"
                )
        if dry_run:
            typer.echo("--dry-run: nothing written")
            return
        import getpass

        who = by.strip() or getpass.getuser()
        if undo:
            card = operating.undo(folder, by=who, reason=reason)
            source = card.threshold_source
        else:
            card = operating.save(folder, chosen, source, split, by=who, reason=reason)
        from app.held_out import recall

        recall(folder, card.threshold)  # the held-out slides' calls at the new threshold (slides.csv)
        previous = card.threshold_history[-1]["from"]  # the change just saved
        because = f", because: {card.threshold_history[-1]['reason']}" if card.threshold_history[-1]["reason"] else ""
        typer.echo(
            f"hospital {hospital}: threshold {card.threshold:.4g} saved in {folder / 'model.json'} ({source}), was "
            f"{previous:.4g}; by {who}{because}"
        )
