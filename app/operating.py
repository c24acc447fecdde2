"""A hospital's operating threshold, chosen once and saved into its model bundle (issue 23, item 4).

The threshold is chosen either by hand or from the clinical floor, with a margin: the highest threshold at which
the lower end of the 95% interval of the hospital's validation sensitivity reaches the floor (Wilson's interval on
the tiles' effective number, slides counted as clusters: `app.evaluation.threshold.bounded_threshold`), so that the
test split only judges it; a hospital without a validation split chooses on test, labelled optimistic. When no threshold
reaches the floor with that confidence, none is proposed (`from_floor` says so). Before a threshold is written, what
it does on test is said (`consequences`: sensitivity, abnormal test slides missed by name, false alarms), and
`undo` restores the value before the last change (the card's ``threshold_history`` keeps it). `save`
writes it into the hospital's ``model.json`` (`models.bundle.set_threshold`) with where it came from and the card's
metrics recomputed at it (`federation.hospital.export.card_metrics`), so ``predict``, the Slide page, the HTML report
and their slide calls all use the same threshold and say which.

Importing this module imports no torch (the dashboard's pages use `card_threshold` and `floor_source`); `save` does,
when a threshold is saved. A threshold chosen on the test split is judged on the same split: its sensitivity there
is optimistic. The card says which split chose it (``threshold_split``) and, in words, ``threshold_source``. A
later round of the same run writes a new card at the default 0.5 (a new model needs its threshold chosen again).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from app.errors import DashboardError
from app.evaluation.metrics import operating_point
from app.evaluation.threshold import TargetThreshold, Unreachable, bounded_threshold
from app.evaluation.words import Consequences, consequences, proposal_words
from app.run_predictions import read_prediction_file
from federation.runfiles import PREDICTIONS_FILE, SLIDES_FILE, VAL_PREDICTIONS_FILE, hospital_dir
from models.decision import slides_of_tiles
from models.names import CARD_FILE

if TYPE_CHECKING:
    from models.bundle import ModelCard
    from models.decision import Slides


def bundle_folder(run: Path, hospital: int) -> Path:
    """``<run>/hospitals/client_XX``, the hospital's bundle; `DashboardError` (one line) when it has no card."""
    folder = hospital_dir(run, hospital)
    if not (folder / CARD_FILE).is_file():
        raise DashboardError(
            f"{folder / CARD_FILE} does not exist: hospital {hospital} of {run} has no model card (a hospital writes "
            "it after each round on its own machine)"
        )
    return folder


def card_threshold(value: float) -> float:
    """``value`` brought strictly between 0 and 1, as a model card's threshold must be (a threshold reaching the
    floor can be a probability of exactly 0 or 1)."""
    return min(max(value, 1e-6), 1.0 - 1e-6)


def floor_source(sensitivity: float, where: str, how: str, split: str = "test") -> str:
    """The ``threshold_source`` of a threshold chosen to reach ``sensitivity`` on ``where`` (``how``: which floor,
    or how many tiles it finds). Chosen on the validation split (``split``), it is judged on test; chosen on the
    test split, the source says that it is optimistic there."""
    if split == "validation":
        return f"reaches sensitivity {sensitivity:.2f} on {where} ({how}; chosen on validation, judged on test)"
    return (
        f"reaches sensitivity {sensitivity:.2f} on {where} ({how}; chosen on the split it is judged on, so optimistic)"
    )


def _bounded(path: Path, sensitivity: float) -> TargetThreshold | Unreachable | None:
    frame = read_prediction_file(path)
    keys = slides_of_tiles(frame["path"].to_numpy()) if "path" in frame.columns else None
    return bounded_threshold(frame["label"].to_numpy(), frame["prob_abnormal"].to_numpy(), sensitivity, keys)


def proposal(folder: Path, sensitivity: float) -> tuple[TargetThreshold, str, str]:
    """The threshold proposed to reach ``sensitivity`` with a margin (`app.evaluation.threshold.bounded_threshold`) on
    the hospital's validation split (``val_predictions.csv``), its ``point`` the test split's at it; on its test split
    (``predictions.csv``), optimistic, when it has no validation split or none with an abnormal tile. With its
    source in words and the split that chose it (``"validation"`` or ``"test"``). `DashboardError` (one line) when
    no split has an abnormal tile or no threshold reaches the floor with 95% confidence (`Unreachable.words`)."""
    if not 0.0 < sensitivity <= 1.0:
        raise DashboardError(f"--sensitivity {sensitivity} is not in (0, 1]: give the floor, for example 0.9")
    val_path, test_path = folder / VAL_PREDICTIONS_FILE, folder / PREDICTIONS_FILE
    found = _bounded(val_path, sensitivity) if val_path.is_file() else None
    split, path = ("validation", val_path) if found is not None else ("test", test_path)
    if found is None:  # no validation split, or one without an abnormal tile: chosen on test, said optimistic
        found = _bounded(test_path, sensitivity)
    if found is None:
        raise DashboardError(f"{path} holds no abnormal tile: no threshold reaches a sensitivity")
    if isinstance(found, Unreachable):
        raise DashboardError(f"{path}: {replace(found, split=split).words}")
    chosen = found.point
    if split == "validation":
        test = read_prediction_file(test_path)
        point = operating_point(test["label"].to_numpy(), test["prob_abnormal"].to_numpy(), found.threshold)
        found = replace(found, point=point, split="validation", chosen=chosen)
    frame = read_prediction_file(path)
    rounds = frame["round"].max() if "round" in frame.columns else None
    name = "validation split" if split == "validation" else "test split"
    where = f"round {int(rounds)}'s {name}" if rounds is not None else f"the {name}"
    how = f"{chosen.tp} of {chosen.abnormal} abnormal tiles, 95% CI lower bound {found.bound:.2f}"
    return found, floor_source(sensitivity, where, how, split), split


def from_floor(folder: Path, sensitivity: float) -> tuple[float, str, str]:
    """`proposal`'s threshold (brought inside (0, 1)), its source in words and the split that chose it."""
    found, source, split = proposal(folder, sensitivity)
    return card_threshold(found.threshold), source, split


def test_slides(folder: Path) -> Slides | None:
    """The hospital's annotated test slides as ``predict`` scored them (``slides.csv``, `app.held_out`), ``None``
    when the file is missing or unreadable."""
    from app.held_out import SlideCallsError, as_slides, read_slide_calls

    path = folder / SLIDES_FILE
    if not path.is_file():
        return None
    try:
        return as_slides(read_slide_calls(path))
    except SlideCallsError:
        return None


def consequences_at(folder: Path, threshold: float) -> Consequences | None:
    """What ``threshold`` does on the hospital's test split (`app.evaluation.words.consequences`): its tiles
    (``predictions.csv``) and its slides (``slides.csv``); ``None`` without test predictions."""
    path = folder / PREDICTIONS_FILE
    if not path.is_file():
        return None
    frame = read_prediction_file(path)
    point = operating_point(frame["label"].to_numpy(), frame["prob_abnormal"].to_numpy(), threshold)
    return consequences(point, test_slides(folder))


def direction(current: float, value: float) -> str:
    """``"raising the threshold from 0.50 to 0.93 (fewer tiles called abnormal)"`` or the lowering one."""
    if value > current:
        return f"raising the threshold from {current:.2f} to {value:.2f} (fewer tiles and slides called abnormal)"
    if value < current:
        return f"lowering the threshold from {current:.2f} to {value:.2f} (more tiles and slides called abnormal)"
    return f"keeping the threshold at {value:.2f}"


def proposal_line(folder: Path, target: TargetThreshold) -> str:
    """`app.evaluation.words.proposal_words` with the hospital's test slides (``slides.csv``)."""
    return proposal_words(target, test_slides(folder))


def save(folder: Path, threshold: float, source: str, split: str = "", *, by: str = "", reason: str = "") -> ModelCard:
    """Save ``threshold`` into the bundle at ``folder`` with ``source`` and the ``split`` that chose it
    (``"validation"``, ``"test"``, or ``""`` for one set by hand), the card's metrics recomputed at it on test;
    the change, ``by`` whom and why (``reason``), goes into the card's ``threshold_history``."""
    from federation.hospital.export import card_metrics
    from models.bundle import set_threshold

    if not 0.0 < threshold < 1.0:
        raise DashboardError(f"threshold {threshold} is not strictly between 0 and 1")
    predictions = folder / PREDICTIONS_FILE
    metrics = card_metrics(predictions, threshold) if predictions.is_file() else None
    return set_threshold(folder, threshold, source, metrics, split, by=by, reason=reason)


def undo(folder: Path, *, by: str = "", reason: str = "") -> ModelCard:
    """Restore the threshold before the card's last change (the last ``threshold_history`` entry's ``from``), as a
    new change (so the history stays whole and its last entry's ``to`` is the threshold), with the source and split
    that value had: the entry before's when it set that value, else the exported default's. `DashboardError` when
    the card has no change to undo."""
    from models.bundle import THRESHOLD_DEFAULT_SOURCE, read_card
    from models.decision import DEFAULT_THRESHOLD

    card = read_card(folder)
    history = card.threshold_history
    if not history:
        raise DashboardError(f"{folder / CARD_FILE}: its threshold was never changed, there is nothing to undo")
    last = history[-1]
    value = float(last["from"])
    source, split = THRESHOLD_DEFAULT_SOURCE, ""
    if len(history) > 1 and abs(float(history[-2]["to"]) - value) <= 1e-12:
        source, split = str(history[-2].get("source") or source), str(history[-2].get("split") or "")
    elif len(history) > 1 or abs(value - DEFAULT_THRESHOLD) > 1e-12:
        source = f"restored {value:.4g}, the value before the change of {last.get('at', '?')}"
    why = reason.strip() or f"undo of the change of {last.get('at', '?')} ({float(last['to']):.4g})"
    return save(folder, value, source, split, by=by, reason=why)
