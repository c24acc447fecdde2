"""The clinical floor as command-line options, shared by ``gastric-fl report`` and ``gastric-fl predict`` (issue 31,
item 4): the same three inputs, with the same defaults, as the dashboard's Verdict page
(`app.evaluation.verdict.Floor`), so a verdict printed in a terminal is the one the page shows with that floor."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from app.errors import DashboardError

if TYPE_CHECKING:
    from app.evaluation.verdict import Floor

# `Floor`'s defaults, written out so that registering the commands imports no pandas (a test holds them equal)
DEFAULT_SENSITIVITY, DEFAULT_MIN_SLIDES, DEFAULT_SPECIFICITY = 0.90, 5, 0.50
SENSITIVITY = typer.Option(
    DEFAULT_SENSITIVITY,
    "--floor",
    help="The clinical floor: the sensitivity each hospital's model must reach at its threshold.",
)
MIN_SLIDES = typer.Option(
    DEFAULT_MIN_SLIDES, "--min-slides", help="Below this many test slides a hospital's model is not judged."
)
SPECIFICITY = typer.Option(
    DEFAULT_SPECIFICITY,
    "--review-specificity",
    help="A model meeting the floor goes to review when its specificity is below this.",
)


def floor_from(sensitivity: float, min_slides: int, specificity: float) -> Floor:
    """The `Floor` of the three options; one line naming them for values out of range."""
    from app.evaluation.verdict import Floor

    try:
        return Floor(sensitivity, min_slides, specificity)
    except ValueError as exc:
        raise DashboardError(f"--floor/--min-slides/--review-specificity: {exc}") from None
