"""A hospital's operating threshold, chosen once and saved into its model bundle (issue 23, item 4).

The threshold is chosen either by hand or from the clinical floor: the highest threshold at which the hospital's
validation split reaches the floor's sensitivity (`app.evaluation.threshold_for_sensitivity`), so that
the test split only judges it; a hospital without a validation split chooses on test, labelled optimistic. `save`
writes it into the hospital's ``model.json`` (`models.bundle.set_threshold`) with where it came from and the card's
metrics recomputed at it (`federation.engine.export.card_metrics`), so ``predict``, the Slide page, the HTML report
and their slide calls all use the same threshold and say which.

Importing this module imports no torch (the dashboard's pages use `card_threshold` and `floor_source`); `save` does,
when a threshold is saved. A threshold chosen on the test split is judged on the same split: its sensitivity there
is optimistic. The card says which split chose it (``threshold_split``) and, in words, ``threshold_source``. A
later round of the same run writes a new card at the default 0.5 (a new model needs its threshold chosen again).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.errors import DashboardError
from app.evaluation import threshold_for_sensitivity
from app.run_records import read_prediction_file
from federation.runfiles import PREDICTIONS_FILE, VAL_PREDICTIONS_FILE, hospital_dir
from models.names import CARD_FILE

if TYPE_CHECKING:
    from models.bundle import ModelCard


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


def from_floor(folder: Path, sensitivity: float) -> tuple[float, str, str]:
    """The highest threshold reaching ``sensitivity`` on the hospital's validation split (``val_predictions.csv``),
    or on its test split (``predictions.csv``) when it has none or none with an abnormal tile, its source in words
    and the split that chose it (``"validation"`` or ``"test"``); `DashboardError` when neither has one."""
    if not 0.0 < sensitivity <= 1.0:
        raise DashboardError(f"--sensitivity {sensitivity} is not in (0, 1]: give the floor, for example 0.9")
    val_path = folder / VAL_PREDICTIONS_FILE
    found = None
    if val_path.is_file():
        split, path = "validation", val_path
        frame = read_prediction_file(path)
        found = threshold_for_sensitivity(frame["label"].to_numpy(), frame["prob_abnormal"].to_numpy(), sensitivity)
    if found is None:  # no validation split, or one without an abnormal tile: chosen on test, said optimistic
        split, path = "test", folder / PREDICTIONS_FILE
        frame = read_prediction_file(path)
        found = threshold_for_sensitivity(frame["label"].to_numpy(), frame["prob_abnormal"].to_numpy(), sensitivity)
    if found is None:
        raise DashboardError(f"{path} holds no abnormal tile: no threshold reaches a sensitivity")
    rounds = frame["round"].max() if "round" in frame.columns else None
    name = "validation split" if split == "validation" else "test split"
    where = f"round {int(rounds)}'s {name}" if rounds is not None else f"the {name}"
    how = f"{found.point.tp} of {found.point.abnormal} abnormal tiles"
    return card_threshold(found.threshold), floor_source(sensitivity, where, how, split), split


def save(folder: Path, threshold: float, source: str, split: str = "", *, by: str = "", reason: str = "") -> ModelCard:
    """Save ``threshold`` into the bundle at ``folder`` with ``source`` and the ``split`` that chose it
    (``"validation"``, ``"test"``, or ``""`` for one set by hand), the card's metrics recomputed at it on test;
    the change, ``by`` whom and why (``reason``), goes into the card's ``threshold_history``."""
    from federation.engine.export import card_metrics
    from models.bundle import set_threshold

    if not 0.0 < threshold < 1.0:
        raise DashboardError(f"threshold {threshold} is not strictly between 0 and 1")
    predictions = folder / PREDICTIONS_FILE
    metrics = card_metrics(predictions, threshold) if predictions.is_file() else None
    return set_threshold(folder, threshold, source, metrics, split, by=by, reason=reason)
