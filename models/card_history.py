"""A model card's threshold history, checked without torch (the dashboard and the HTML report read ``model.json``
as JSON and check it here, as `models.bundle.ModelCard` does where a model is loaded; docs/inference.md).

Every saved change of a card's decision threshold is an entry of ``threshold_history`` (`models.bundle.
set_threshold`); the card is trusted only when the entries are well-formed and chain from one to the next up to the
card's threshold, so that a hand edit of ``model.json`` cannot pass for a decision somebody recorded.
"""

from __future__ import annotations

from models.decision import DEFAULT_THRESHOLD

THRESHOLD_DEFAULT_SOURCE = "the default 0.5"
# the longest ``by`` and ``reason`` a threshold change keeps (printable text only: `note_problem`)
MAX_BY = 100
MAX_REASON = 500
MAX_SOURCE = 1000
HISTORY_KEYS = ("from", "to", "source", "split", "by", "at", "reason")
EDITED = "the card was changed outside gastric-fl threshold"


def note_problem(name: str, value: str, limit: int) -> str | None:
    """Why ``value`` (``name``: the option or field) cannot go into a card's threshold history: text that is not
    printable (a newline could forge a line such as "threshold: 0.9" wherever it is echoed; `str.isprintable`:
    no control, format or separator character but the space) or longer than ``limit`` characters."""
    bad = next((ch for ch in value if not ch.isprintable()), None)
    if bad is not None:
        return f"{name} holds the control character {bad!r}: write it on one line, in printable characters"
    if len(value) > limit:
        return f"{name} is {len(value)} characters long: keep it to {limit}"
    return None


def history_problem(threshold: float, source: str, split: str, history: object) -> str | None:
    """Why a card's ``threshold_history`` (``history``, as read from ``model.json``) does not describe its
    ``threshold`` (with its ``threshold_source`` ``source`` and ``threshold_split`` ``split``), in one line, or
    ``None``.

    Every entry is a change `set_threshold` wrote: an object with ``from`` and ``to`` strictly between 0 and 1,
    ``split`` one of ``""``, ``validation``, ``test``, and ``source``, ``by``, ``at``, ``reason`` printable text
    within `MAX_SOURCE`, `MAX_BY`, `MAX_REASON`; each starts where the one before ended (``from`` = the previous
    ``to``), and the last one ends at the card's ``threshold``, ``threshold_source`` and ``threshold_split``. A card
    without history holds the exported default unless its source says otherwise: a threshold that is not 0.5 with
    the source "the default 0.5" was edited by hand.
    """
    if history is None:
        history = []
    if not isinstance(history, list | tuple):
        return f"threshold_history is a {type(history).__name__}, not a list of changes: {EDITED}"
    default = abs(threshold - DEFAULT_THRESHOLD) <= 1e-12
    if source == THRESHOLD_DEFAULT_SOURCE and not default:
        return (
            f"threshold {threshold:g} says it is {THRESHOLD_DEFAULT_SOURCE}: {EDITED}; put back threshold = "
            f"{DEFAULT_THRESHOLD} (then set it with gastric-fl threshold) or export the bundle again"
        )
    previous: float | None = None
    for i, entry in enumerate(history, start=1):
        where = f"threshold_history entry {i} of {len(history)}"
        if not isinstance(entry, dict) or sorted(entry) != sorted(HISTORY_KEYS):
            found = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            return f"{where} is not a threshold change (keys {list(HISTORY_KEYS)}, found {found}): {EDITED}"
        for key in ("from", "to"):
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < float(value) < 1.0:
                return f"{where}: {key} = {value!r} is not a threshold strictly between 0 and 1: {EDITED}"
        for key, limit in (("source", MAX_SOURCE), ("by", MAX_BY), ("at", 64), ("reason", MAX_REASON)):
            text = entry[key]
            problem = f"{key} is not text" if not isinstance(text, str) else note_problem(key, text, limit)
            if problem is not None:
                return f"{where}: {problem}: {EDITED}"
        if entry["split"] not in ("", "validation", "test"):
            return f"{where}: split = {entry['split']!r} is not validation, test or empty: {EDITED}"
        if previous is not None and abs(float(entry["from"]) - previous) > 1e-12:
            return (
                f"{where} starts from {float(entry['from']):g}, but the change before it ended at {previous:g}: "
                f"{EDITED}"
            )
        previous = float(entry["to"])
    if history:
        last = history[-1]
        ends = (float(last["to"]), str(last["source"]), str(last["split"]))
        if abs(ends[0] - threshold) > 1e-12 or ends[1:] != (source, split):
            return (
                f"threshold {threshold:g} ({source}) is not where threshold_history's last "
                f"change ended ({ends[0]:g}, {ends[1]}): {EDITED}; put back threshold = {ends[0]:g} with its source, "
                "or export the bundle again"
            )
    return None
