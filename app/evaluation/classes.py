"""A model of more than two classes (issue 51: Table 7 of FedSAF paper 001 on Fashion-MNIST, 10 classes): what of
a hospital's test predictions applies to it, for the HTML report and the dashboard.

Its ``predictions.csv`` holds ``client, path, label``, one ``prob_<class>`` column per class in class-index order and
``round`` (`federation.runfiles.prediction_columns`); `read_class_predictions` reads it. What applies: the accuracy
(a tile's class is the one of highest probability, the engine's own rule, `class_accuracy`), the macro one-vs-rest
AUC over the classes present (`macro_auc`: the hospital's own `federation.hospital.evaluation.multiclass_auc`, the
figure the engine records as ``test_auc``; imported when first computed, as it loads torch) and the confusion matrix
by class (`class_confusion`). What does not: the binary task's verdict, threshold, sensitivity and specificity, ROC
curve, slide calls and heatmaps; `not_applicable` says so in one sentence, the same words on every page.
Nothing here imports torch or scikit-learn at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from federation.runfiles import prediction_classes, scan_predictions
from infra.formats import BINARY_CLASSES
from infra.records import RecordError

PROB_PREFIX = "prob_"


@dataclass(frozen=True)
class ClassPredictions:
    """One hospital's test tiles from a multi-class ``predictions.csv``: the class names in class-index order, per
    tile its dataset-relative path, label (class index) and probabilities (N, K), the hospital index and the round
    the file was written after (``None``: not said)."""

    classes: tuple[str, ...]
    hospital: int | None
    paths: tuple[str, ...]
    labels: npt.NDArray[np.int64]
    probs: npt.NDArray[np.float64]
    round: int | None


def is_multi_class(classes: Sequence[str]) -> bool:
    """Whether a model of these classes is not the binary normal / abnormal one (more than two classes)."""
    return len(classes) > len(BINARY_CLASSES)


def read_class_predictions(path: Path) -> ClassPredictions:
    """A multi-class ``predictions.csv`` (module docstring) as `ClassPredictions`, read by the one reader of the file,
    `federation.runfiles.scan_predictions`; `infra.records.RecordError` naming the file (and line) for a missing,
    unreadable or malformed file, one holding several hospitals, or one of two classes (``kind="other_task"``: the
    binary task's reader is `federation.runfiles.read_predictions`)."""
    classes = prediction_classes(path)
    if not is_multi_class(classes):
        if not classes:  # a missing or unreadable file is said as such by the reader
            scan_predictions(path, (), {}, "")
        raise RecordError(
            f"{path} holds the predictions of a model of {len(classes)} classes, not more than two",
            kind="other_task",
            path=path,
        )
    label_rule = f"one of the classes {', '.join(classes)}"
    rows = scan_predictions(
        path, [f"{PROB_PREFIX}{c}" for c in classes], {c: i for i, c in enumerate(classes)}, label_rule
    )
    return ClassPredictions(
        classes,
        rows.hospital,
        rows.paths,
        np.asarray(rows.labels, dtype=np.int64),
        np.asarray(rows.probs, dtype=np.float64).reshape(len(rows.probs), len(classes)),
        rows.round,
    )


def class_accuracy(labels: npt.ArrayLike, probs: npt.ArrayLike) -> float | None:
    """The share of tiles whose class of highest probability is their label (the engine's ``test_acc``);
    ``None`` without tiles."""
    y, p = np.asarray(labels, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    return float((p.argmax(axis=1) == y).mean()) if len(y) else None


def class_confusion(labels: npt.ArrayLike, probs: npt.ArrayLike, count: int) -> npt.NDArray[np.int64]:
    """``count`` x ``count`` tile counts: row the true class, column the class of highest probability (the first
    of tied ones, as argmax takes it); the diagonal holds the right calls."""
    y, p = np.asarray(labels, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    matrix = np.zeros((count, count), dtype=np.int64)
    if len(y):
        np.add.at(matrix, (y, p.argmax(axis=1)), 1)
    return matrix


def macro_auc(labels: npt.ArrayLike, probs: npt.ArrayLike) -> float | None:
    """The macro one-vs-rest AUC over the classes present in ``labels`` (the unweighted mean of each class's AUC
    against the rest): the hospital's own `federation.hospital.evaluation.multiclass_auc`, the figure
    ``metrics.jsonl`` records as ``test_auc``; ``None`` when fewer than two classes occur."""
    from federation.hospital.evaluation import multiclass_auc

    return multiclass_auc(np.asarray(labels, dtype=np.int64), np.asarray(probs, dtype=np.float64))


def not_applicable(count: int, notions: str) -> str:
    """The one sentence every page and report gives where a binary notion does not apply to a ``count``-class model,
    ``notions`` naming them (e.g. "the verdict and its floor")."""
    return f"Not applicable to this {count}-class model: {notions} (they judge the normal / abnormal task)."
