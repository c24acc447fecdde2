"""A hospital's evaluation of its model on its own tiles, and the statistics it recomputes for it.

`evaluate`: base + own head on the hospital's test split (or its validation split): mean cross-entropy, accuracy
(argmax) and AUC from the softmax (`auc_of`: class 1's probability for two classes, macro one-vs-rest over the
classes present for more, `multiclass_auc`). `precise_batchnorm`: BatchNorm running statistics recomputed as the
average of the batch statistics over one pass of the un-augmented training tiles (precise BN). Both read their
batches from the hospital's `federation.hospital.batches.BatchSource` (the CPU path or the device path).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn

from federation.errors import FederationError
from federation.hospital import gpu
from federation.hospital.batches import BatchSource


@dataclass(frozen=True)
class EvalResult:
    """A hospital's model on its own test split: mean loss, accuracy, AUC (``None`` when undefined: a single-class
    split) and the softmax probabilities ``probs`` (N, K) in float64, one column per class."""

    loss: float
    acc: float
    auc: float | None
    probs: np.ndarray

    @property
    def prob_abnormal(self) -> np.ndarray:
        """``P(class 1)`` per tile: the binary task's probability of ``abnormal``."""
        if self.probs.shape[1] != 2:
            raise FederationError(f"prob_abnormal is defined for two classes, this model has {self.probs.shape[1]}")
        return self.probs[:, 1]


def auc_or_none(labels: np.ndarray, prob_abnormal: np.ndarray) -> float | None:
    """ROC AUC of ``prob_abnormal`` against ``labels``; ``None`` when the labels hold one class (AUC undefined)."""
    if np.unique(labels).size < 2:
        return None
    return float(roc_auc_score(labels, prob_abnormal))


def multiclass_auc(labels: np.ndarray, probs: np.ndarray) -> float | None:
    """Macro one-vs-rest ROC AUC of ``probs`` (N, K) against ``labels`` (class indices), over the classes present.

    For each class ``c`` that occurs in ``labels``: the AUC of ``probs[:, c]`` separating class ``c`` from every
    other tile; the mean of these, unweighted. When every class occurs this is scikit-learn's
    ``roc_auc_score(labels, probs, multi_class="ovr", average="macro")``; a class absent from ``labels`` (a
    hospital's test split without it) has no one-vs-rest AUC and is left out, where scikit-learn would stop.
    ``None`` when fewer than two classes occur or a probability is not finite (diverged weights).
    """
    y = np.asarray(labels, dtype=np.int64)
    p = np.asarray(probs, dtype=np.float64)
    present = np.unique(y)
    if present.size < 2 or not bool(np.isfinite(p).all()):
        return None
    return float(np.mean([roc_auc_score(y == c, p[:, c]) for c in present]))


def auc_of(labels: np.ndarray, probs: np.ndarray) -> float | None:
    """The evaluation's AUC from softmax ``probs`` (N, K): two classes, the AUC of class 1's probability (as
    ever); more, `multiclass_auc`. ``None`` when undefined (one class in ``labels``, non-finite probabilities)."""
    if not bool(np.isfinite(probs).all()):
        return None
    if probs.shape[1] == 2:
        return auc_or_none(labels, probs[:, 1])
    return multiclass_auc(labels, probs)


@torch.no_grad()
def evaluate(model: nn.Module, source: BatchSource, split: str, batch_size: int, precision: str) -> EvalResult:
    """``model`` on the hospital's test split (``split="val"``: its validation split), in batches of
    ``batch_size``, in bf16 autocast on the device when ``precision = "bf16"``: mean cross-entropy, accuracy
    (argmax), AUC from the softmax in float64 (`auc_of`)."""
    model.eval()
    split = "val" if split == "val" else "test"
    total_loss, correct = 0.0, 0
    probs: list[np.ndarray] = []
    labels = source.split(split)[1]
    n = int(labels.shape[0])
    for start in range(0, n, batch_size):
        x, y = source.plain(split, start, min(start + batch_size, n))
        with gpu.autocast(source.device, precision):
            logits = model(x).float()
        total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
        probs.append(torch.softmax(logits.double(), dim=1).cpu().numpy())
    prob = np.concatenate(probs)
    # Diverged weights give NaN probabilities: their AUC is undefined, not a crash inside scikit-learn.
    return EvalResult(loss=total_loss / n, acc=correct / n, auc=auc_of(labels, prob), probs=prob)


@torch.no_grad()
def precise_batchnorm(
    model: nn.Module, source: BatchSource, batch_size: int, precision: str, keep: Collection[str] = ()
) -> None:
    """Precise BN: every BatchNorm's running statistics become the average of its batch statistics over one pass
    of the un-augmented training tiles (cumulative average, ``momentum=None``), for the current weights.

    A layer whose ``running_mean`` key is in ``keep`` (statistics that came with the shared weights) keeps its
    statistics and normalises with them during the pass (eval mode), as it will in evaluation. On the device path
    the pass runs in the precision's autocast, on the CPU in float32.
    """
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    kept = [m for n, m in named if f"{n}.running_mean" in keep]
    norms = [m for n, m in named if f"{n}.running_mean" not in keep]
    num_train = source.data.num_train
    if not norms or num_train == 0:
        return
    momenta = [m.momentum for m in norms]
    for module in norms:
        module.reset_running_stats()
        module.momentum = None
    model.train()
    for module in kept:
        module.eval()
    for start in range(0, num_train, batch_size):
        stop = min(start + batch_size, num_train)
        if source.on_gpu:
            with gpu.autocast(source.device, precision):
                model(source.plain("train", start, stop)[0])
        else:
            model(source.plain("train", start, stop)[0])
    for module, momentum in zip(norms, momenta, strict=True):
        module.momentum = momentum
