"""Each hospital's operating threshold as its model card states it, for the Verdict page, ``gastric-fl report``'s
verdicts and ``gastric-fl predict``'s (`app.verdicts`): the threshold, where it came from in words and the split
that chose it, read from the cards of a run (``hospitals/client_XX/model.json``, written by ``models.bundle``;
`federation.run_reader.read_cards`). A card whose threshold history does not describe its threshold
(`models.card_history.history_problem`: ``model.json`` edited by hand) is marked as not trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.run_reader import read_cards
from models.card_history import THRESHOLD_DEFAULT_SOURCE, history_problem


def _card_threshold(card: Mapping[str, Any]) -> float | None:
    value = card.get("threshold")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0.0 < value < 1.0:
        return float(value)
    return None


def card_thresholds(run: Path) -> dict[int, float]:
    """Each hospital's decision threshold from its model card (``hospitals/client_XX/model.json``, written by
    ``models.bundle``), by client; hospitals without a readable card, or with no threshold in it, are left out."""
    return {c: t for c, card in read_cards(run).items() if (t := _card_threshold(card)) is not None}


@dataclass(frozen=True)
class CardThreshold:
    """A hospital's operating threshold as its model card states it: the value, where it came from in words
    (``threshold_source``) and the split that chose it (``threshold_split``: validation, test, or empty)."""

    value: float
    source: str
    split: str = ""


NO_CARD = CardThreshold(0.5, "the default 0.5 (no model card)")


def card_operating(run: Path) -> dict[int, CardThreshold]:
    """Each hospital's `CardThreshold` (each card read once), for the hospitals of `card_thresholds`; a hospital
    without one decides at `NO_CARD`."""
    found = {}
    for hospital, card in read_cards(run).items():
        value = _card_threshold(card)
        if value is not None:
            split = card.get("threshold_split")
            found[hospital] = CardThreshold(value, _card_source(card), split if split in ("validation", "test") else "")
    return found


def _card_source(card: Mapping[str, Any]) -> str:
    """Where the card says its threshold came from (``threshold_source``), or, for a card whose threshold history
    does not describe its threshold (`models.card_history.history_problem`: ``model.json`` edited by hand), that it
    cannot be trusted and why: `predict` and `gastric-fl threshold` refuse such a card."""
    source = str(card.get("threshold_source") or THRESHOLD_DEFAULT_SOURCE)
    split = card.get("threshold_split") or ""
    threshold = _card_threshold(card)
    if threshold is None:
        return source
    problem = history_problem(threshold, source, str(split), card.get("threshold_history"))
    return source if problem is None else f"NOT TRUSTED: {problem}"


def card_threshold_sources(run: Path) -> dict[int, str]:
    """Where each hospital's card threshold came from (``threshold_source``: the default, set by hand, from the
    floor; `models.bundle.set_threshold`), for the hospitals of `card_thresholds` (each card read once)."""
    return {c: _card_source(card) for c, card in read_cards(run).items() if _card_threshold(card) is not None}
