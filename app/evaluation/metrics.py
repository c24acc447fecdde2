"""Hospitals' test predictions at a threshold: ROC curve and AUC, the confusion matrix and the operating point,
ranked example tiles, and the slides the tiles come from.

FedSAF paper (Miao et al., 2025), Sec. 5 reports accuracy per client; the dashboard adds what a clinician reads
next: the ROC curve (scikit-learn's ``roc_curve``/``roc_auc_score`` on the softmax probability of "abnormal",
the same probabilities the engine's ``test_auc`` uses), sensitivity and specificity at the threshold the model
decides with, and the errors the model was most sure about.

A tile is called abnormal when its probability is *at least* the threshold (``models.bundle``'s decision rule),
so tiles tied with the threshold count as abnormal everywhere here.
scikit-learn is imported on first use (it takes about a second), so a page shows its first content before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from models.decision import slide_of_tile, slides_of_tiles, wilson_interval


def slide_key(path: str) -> str | None:
    """The slide a tile comes from (`models.decision.slide_of_tile`)."""
    return slide_of_tile(path)


def count_slides(paths: npt.ArrayLike) -> int | None:
    """How many slides ``paths`` (tile paths) come from; ``None`` when a name does not say (tiles of unknown
    origin are not counted as slides of their own)."""
    keys = slides_of_tiles(paths)
    return None if keys is None else len(set(keys))


@dataclass(frozen=True)
class Roc:
    """False/true positive rates along decreasing thresholds, and the area under them (``None``: one class)."""

    fpr: np.ndarray
    tpr: np.ndarray
    thresholds: np.ndarray
    auc: float | None


def roc(labels: np.ndarray, probs: np.ndarray) -> Roc:
    """ROC of abnormal-vs-normal; with a single class in ``labels`` the AUC is undefined (``None``), not 0.5."""
    labels = np.asarray(labels, dtype=int)
    probs = np.asarray(probs, dtype=float)
    if len(np.unique(labels)) < 2:
        return Roc(np.array([0.0, 1.0]), np.array([0.0, 1.0]), np.array([np.inf, 0.0]), None)
    from sklearn.metrics import roc_auc_score, roc_curve

    fpr, tpr, thresholds = roc_curve(labels, probs)
    return Roc(fpr, tpr, thresholds, float(roc_auc_score(labels, probs)))


def confusion(labels: np.ndarray, probs: np.ndarray, threshold: float) -> np.ndarray:
    """2x2 counts ``[[TN, FP], [FN, TP]]``: rows the true class (normal, abnormal), columns the prediction.

    A tile is predicted abnormal when its probability is at least ``threshold``.
    """
    labels = np.asarray(labels, dtype=int)
    predicted = (np.asarray(probs, dtype=float) >= threshold).astype(int)
    matrix = np.zeros((2, 2), dtype=int)
    np.add.at(matrix, (labels, predicted), 1)
    return matrix


def rates(matrix: np.ndarray) -> dict[str, float]:
    """Accuracy, sensitivity (abnormal recall) and specificity (normal recall) of a confusion matrix; NaN if 0/0."""
    tn, fp, fn, tp = (float(v) for v in np.asarray(matrix).ravel())

    def ratio(num: float, den: float) -> float:
        return num / den if den else float("nan")

    return {
        "accuracy": ratio(tn + tp, tn + fp + fn + tp),
        "sensitivity": ratio(tp, tp + fn),
        "specificity": ratio(tn, tn + fp),
    }


def ranked_examples(predictions: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Test tiles with their prediction, errors first, most confident error first, then correct ones.

    ``confidence`` is the probability the model gave to the class it predicted; for an error that is how sure it
    was of the wrong answer, which is what a clinician wants to look at first.
    """
    frame = predictions.copy()
    frame["predicted"] = (frame["prob_abnormal"] >= threshold).astype(int)
    frame["error"] = frame["predicted"] != frame["label"]
    frame["confidence"] = np.where(frame["predicted"] == 1, frame["prob_abnormal"], 1.0 - frame["prob_abnormal"])
    ordered = frame.sort_values(["error", "confidence", "path"], ascending=[False, False, True], kind="stable")
    return ordered.reset_index(drop=True)


# --- the operating point ---------------------------------------------------------------------------------------


def _ratio(num: int, den: int) -> float:
    return num / den if den else float("nan")


@dataclass(frozen=True)
class OperatingPoint:
    """What a model does at one threshold: the four counts of the confusion matrix and the rates they give.

    ``tp``/``fn``: abnormal tiles called abnormal / normal; ``tn``/``fp``: normal tiles called normal / abnormal.
    A rate whose denominator is zero (no abnormal tile, say) is NaN, not 0 or 1.
    """

    threshold: float
    tp: int
    fn: int
    tn: int
    fp: int

    @property
    def abnormal(self) -> int:
        """Abnormal tiles (true label)."""
        return self.tp + self.fn

    @property
    def normal(self) -> int:
        """Normal tiles (true label)."""
        return self.tn + self.fp

    @property
    def sensitivity(self) -> float:
        """Share of abnormal tiles called abnormal (true positive rate)."""
        return _ratio(self.tp, self.abnormal)

    @property
    def specificity(self) -> float:
        """Share of normal tiles called normal (true negative rate)."""
        return _ratio(self.tn, self.normal)

    @property
    def accuracy(self) -> float:
        """Share of all tiles called right."""
        return _ratio(self.tp + self.tn, self.abnormal + self.normal)

    @property
    def sensitivity_interval(self) -> tuple[float, float] | None:
        """95% Wilson interval of the sensitivity (`wilson_interval`); ``None`` without abnormal tiles."""
        return wilson_interval(self.tp, self.abnormal)

    @property
    def specificity_interval(self) -> tuple[float, float] | None:
        """95% Wilson interval of the specificity; ``None`` without normal tiles."""
        return wilson_interval(self.tn, self.normal)


def operating_point(labels: npt.ArrayLike, probs: npt.ArrayLike, threshold: float) -> OperatingPoint:
    """Counts and rates when a tile is called abnormal at ``probs >= threshold`` (label 1 = abnormal)."""
    (tn, fp), (fn, tp) = confusion(np.asarray(labels), np.asarray(probs), threshold).tolist()
    return OperatingPoint(float(threshold), tp=int(tp), fn=int(fn), tn=int(tn), fp=int(fp))
