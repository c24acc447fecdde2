"""One hospital's test predictions: ROC curve and AUC, confusion matrix at a threshold, ranked example tiles.

FedSAF paper (Miao et al., 2025), Sec. 5 reports accuracy per client; the dashboard adds what a clinician reads
next: the ROC curve (scikit-learn's ``roc_curve``/``roc_auc_score`` on the softmax probability of "abnormal",
the same probabilities the engine's ``test_auc`` uses) and the errors the model was most sure about.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score, roc_curve


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
