"""A change of a hospital's operating threshold on the Verdict and Hospital pages: proposed by a button, said
before anything is written (the direction, what the new threshold gives on the test split, the split that chose
it), confirmed with who (and why) or cancelled, then saved into the model bundle (`app.operating`), and undone the
same way. Saving and undoing are one flow (`_confirmed_change`); the message of a change just saved is shown after
the rerun that redraws the page at the new threshold (`flash`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from app.datasets import hospital_label
from app.errors import DashboardError
from app.run_records import RunInfo

if TYPE_CHECKING:
    from models.bundle import ModelCard

FLASH_KEY = "_saved_threshold"
SPLIT_WORDS = {
    "validation": "chosen on the validation split, judged on the test split",
    "test": "chosen on the test split it is judged on, so optimistic",
    "": "set by hand",
}


def flash() -> None:
    """The message of a threshold just saved (kept across the rerun that redraws the page at the new threshold)."""
    message = st.session_state.pop(FLASH_KEY, None)
    if message:
        st.success(message, icon=":material/check_circle:")


def _consequences(run: Path, hospital: int, current: float, value: float) -> None:
    """What changing ``hospital``'s threshold from ``current`` to ``value`` does, said before anything is written:
    the direction (`app.operating.direction`) and what ``value`` gives on its test split (`app.operating.
    consequences_at`: sensitivity, abnormal test slides missed by name, false alarms); an abnormal test slide it
    would call normal is said plainly, as an error."""
    from app import operating

    try:
        found = operating.consequences_at(operating.bundle_folder(run, hospital), value)
    except DashboardError as exc:
        st.warning(f"What {value:.2f} does on test cannot be shown: {exc}", icon=":material/warning:")
        return
    st.markdown(f"This means **{operating.direction(current, value)}**.")
    if found is None:
        st.warning("This hospital has no test predictions, so what it does on test cannot be shown.")
        return
    st.markdown(f"On {hospital_label(hospital)}'s test split at {value:.2f}: {found.words}.")
    if found.misses_abnormal_slide:
        st.error(
            f"At {value:.2f} the model calls {len(found.missed)} of {found.abnormal_slides} abnormal test slides "
            f"normal ({', '.join(found.missed)}): cancers it would miss. Save it only knowing that.",
            icon=":material/error:",
        )


@dataclass(frozen=True)
class _Change:
    """A threshold change that waits for confirmation: the button that proposes it (``label``, ``icon``), the
    question asked before anything is written, the threshold it goes to (``value``), the label of the who field,
    whether a reason is asked too (``why``), the confirm button's label, and what is said when who (or why) is
    missing."""

    label: str
    icon: str
    question: str
    value: float
    who: str
    why: bool
    confirm: str
    missing: str


def _confirmed_change(
    run: Path,
    hospital: int,
    key: str,
    current: float,
    change: _Change,
    write: Callable[[Path, str, str], ModelCard],
    done: Callable[[ModelCard], str],
) -> None:
    """The one flow of a threshold change (`save_threshold_button`, `undo_button`): its button sets it pending; a
    pending change asks ``change.question``, says the direction and what ``change.value`` gives on test
    (`_consequences`), asks who (and why), and waits for Confirm or Cancel. Confirmed, ``write(folder, who, why)``
    saves it into the bundle (`app.operating`), the held-out slides are called again at the card's new threshold,
    ``done(card)`` is kept as the message shown after the rerun that redraws the page at it."""
    pending = f"{key}_pending"
    if st.button(change.label, key=key, icon=change.icon):
        st.session_state[pending] = True
    if not st.session_state.get(pending):
        return
    with st.container(border=True):
        st.markdown(change.question)
        _consequences(run, hospital, current, change.value)
        who = st.text_input(change.who, key=f"{key}_who", placeholder="your name")
        why = (
            st.text_input("Why", key=f"{key}_why", placeholder="for example: agreed at the tumour board")
            if change.why
            else ""
        )
        confirm, cancel = st.columns(2)
        if cancel.button("Cancel", key=f"{key}_cancel"):
            st.session_state.pop(pending, None)
            st.rerun()
        if not confirm.button(change.confirm, key=f"{key}_confirm", type="primary"):
            return
        if not who.strip() or (change.why and not why.strip()):
            st.error(change.missing, icon=":material/error:")
            return
    from app import operating

    try:
        folder = operating.bundle_folder(run, hospital)
        card = write(folder, who, why)
        from app.held_out import recall

        recall(folder, card.threshold)  # the held-out slides' calls at the new threshold (slides.csv)
    except (DashboardError, ValueError) as exc:
        st.error(str(exc), icon=":material/error:")
        return
    st.session_state.pop(pending, None)
    st.session_state[FLASH_KEY] = done(card)
    st.rerun()  # every figure on the page at the new threshold, now


def save_threshold_button(
    run: Path, hospital: int, value: float, source: str, label: str, key: str, split: str = "", current: float = 0.5
) -> None:
    """A button that proposes ``value`` as the hospital's operating threshold, then asks for confirmation: the
    direction of the change (``current`` to ``value``), what ``value`` gives on test (`_consequences`), the split
    that chose it, who decides and why. Confirmed, it is saved into the model bundle (`app.operating.save`, the old
    value, who, when and why kept in the card's ``threshold_history``), the held-out slides are called again at
    it, and the page is redrawn at once at the new threshold. The Slide page, its calls, the HTML report and
    ``predict`` then use it; `undo_button` takes it back."""
    question = (
        f"**Change {hospital_label(hospital)}'s operating threshold from {current:.2f} to {value:.2f}?** "
        f"It is {SPLIT_WORDS.get(split, split)} ({source}). Every page, the HTML report and `gastric-fl predict` "
        "will call its tiles and slides at it; the old value is kept in the model card's history, and Undo "
        "brings it back."
    )
    missing = "Say who decides and why: both are kept in the model card's history."
    change = _Change(label, ":material/save:", question, value, "Who decides", True, f"Confirm: decide at {value:.2f}",
                     missing)  # fmt: skip

    def write(folder: Path, who: str, why: str) -> ModelCard:
        from app import operating

        return operating.save(folder, value, source, split, by=who, reason=why)

    def done(card: ModelCard) -> str:
        return (
            f"Saved: {hospital_label(hospital)} now decides at threshold {card.threshold:.2f} "
            f"({card.threshold_source}), was {current:.2f}. Every page, the HTML report and `gastric-fl predict` "
            "use it."
        )

    _confirmed_change(run, hospital, key, current, change, write, done)


def undo_button(run: Path, hospital: int, key: str) -> None:
    """Undo the last saved change of ``hospital``'s threshold (its model card's ``threshold_history``): the button
    names the value it goes back to; confirmed with who, after the direction and what that value gives on test
    (`_consequences`), it is saved as a new change (`app.operating.undo`: the history stays whole) and the
    held-out slides are called again at it. Not shown when the card has no change."""
    from app.slide_view import read_card_json
    from federation.runfiles import hospital_dir

    try:
        card = read_card_json(hospital_dir(run, hospital))
    except (DashboardError, ValueError, OSError):
        return
    history = card.get("threshold_history") or []
    if not history or not isinstance(history[-1], dict) or "from" not in history[-1]:
        return
    try:
        current, previous = float(card.get("threshold", 0.5)), float(history[-1]["from"])
    except (TypeError, ValueError):
        return
    question = (
        f"**Undo {hospital_label(hospital)}'s last threshold change ({previous:.2f} to {current:.2f}, "
        f"{history[-1].get('at', 'time unknown')})?** The undo is kept in the model card's history too."
    )
    missing = "Say who undoes it: it is kept in the model card's history."
    change = _Change(f"Undo: back to {previous:.2f}", ":material/undo:", question, previous, "Who undoes it", False,
                     f"Confirm: back to {previous:.2f}", missing)  # fmt: skip

    def write(folder: Path, who: str, why: str) -> ModelCard:
        from app import operating

        return operating.undo(folder, by=who)

    def done(saved: ModelCard) -> str:
        return (
            f"Undone: {hospital_label(hospital)} decides at threshold {saved.threshold:.2f} again "
            f"({saved.threshold_source}), was {current:.2f}."
        )

    _confirmed_change(run, hospital, key, current, change, write, done)


def save_floor_button(
    info: RunInfo,
    hospital: int,
    threshold: float,
    current: float,
    sensitivity: float,
    floor_name: str,
    whose: str,
    reaches: str,
    split: str = "test",
) -> None:
    """`save_threshold_button` for the threshold that reaches a sensitivity floor on the ``split`` that chose it
    (``threshold``, from `app.evaluation.threshold.chosen_target`: the validation split where the hospital has one,
    else the test split, labelled optimistic), shown only where it differs from the hospital's ``current`` one;
    its source names the floor (``floor_name``, e.g. "the Verdict page's floor"), and its label says "Save T as
    ``whose`` threshold (reaches ``reaches``)"."""
    from app import operating

    value = operating.card_threshold(threshold)
    if abs(value - current) > 1e-9:
        where = "the validation split" if split == "validation" else "the test split"
        source = operating.floor_source(sensitivity, where, floor_name, split)
        label = f"Save {value:.2f} as {whose} threshold (reaches {reaches} on {where})"
        key = f"save_floor_{info.run_id}_{hospital}"
        save_threshold_button(info.path, hospital, value, source, label, key, split, current)
