"""Hospitals' test predictions: ROC curve and AUC, the operating point at a threshold, the threshold that reaches a
target sensitivity, the scorecard's warning rule, and ranked example tiles.

FedSAF paper (Miao et al., 2025), Sec. 5 reports accuracy per client; the dashboard adds what a clinician reads
next: the ROC curve (scikit-learn's ``roc_curve``/``roc_auc_score`` on the softmax probability of "abnormal",
the same probabilities the engine's ``test_auc`` uses), sensitivity and specificity at the threshold the model
decides with, and the errors the model was most sure about.

A tile is called abnormal when its probability is *at least* the threshold (``models.bundle``'s decision rule),
so tiles tied with the threshold count as abnormal everywhere here. A high AUC only says the tiles are ranked well;
`auc_warning` says when the threshold in use still misses most abnormal tiles or flags most normal ones, and
`accuracy_warning` (the Federation page, which has only the run's AUC and accuracy) points to where to look.
scikit-learn is imported on first use (it takes about a second), so a page shows its first content before it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pandas as pd

from app.datasets import hospital_label
from models.decision import (
    AucInterval,
    Slides,
    auc_interval_text,
    interval_text,
    slide_bootstrap_auc,
    slide_of_tile,
    slide_scores,
    slides_of_tiles,
    wilson_interval,
)

# The scorecard's warning rule: a hospital whose AUC reaches WARN_AUC but whose sensitivity or specificity at the
# threshold in use is below WARN_RATE gets a warning in words.
WARN_AUC = 0.8
WARN_RATE = 0.5
# A threshold proposed for a sensitivity floor must keep at least this specificity on the split that chooses it:
# one that reaches the floor only by calling most normal tissue abnormal is said, not proposed (`bounded_threshold`)
MIN_SPECIFICITY = 0.5
# The Federation page has only metrics.jsonl's figures (AUC, accuracy at threshold 0.5), no sensitivity or
# specificity: there a hospital whose AUC reaches WARN_AUC while its accuracy is below WARN_ACC is pointed to
# the scorecard.
WARN_ACC = 0.7
# Below this many test slides a hospital's figures are too few to judge (the Hospital page lets the user change it).
MIN_TEST_SLIDES = 5
# The default clinical floor's sensitivity (`Floor`); a floor set below it is said on every verdict badge.
DEFAULT_FLOOR = 0.90


def slide_key(path: str) -> str | None:
    """The slide a tile comes from (`models.decision.slide_of_tile`)."""
    return slide_of_tile(path)


def count_slides(paths: npt.ArrayLike) -> int | None:
    """How many slides ``paths`` (tile paths) come from; ``None`` when a name does not say (tiles of unknown
    origin are not counted as slides of their own)."""
    keys = slides_of_tiles(paths)
    return None if keys is None else len(set(keys))


def slides_warning(slides: int | None, minimum: int) -> str | None:
    """A plain sentence when a hospital's test split comes from fewer than ``minimum`` slides (its rates and AUC
    are then too uncertain to judge it by), else ``None`` (also when the slide count is unknown)."""
    if slides is None or slides >= minimum:
        return None
    return (
        f"too few slides to show it is good enough: its test tiles come from {slides} "
        f"slide{'s' if slides != 1 else ''} (at least {minimum} wanted), and tiles of one slide are not independent."
    )


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


# --- the operating point and the scorecard ---------------------------------------------------------------------


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


@dataclass(frozen=True)
class TargetThreshold:
    """The threshold proposed to reach a target sensitivity, and what the model does there.

    ``split``: where the threshold was chosen. ``"validation"``: on the hospital's validation split, and ``point``
    is what it gives on the test split (an honest estimate); ``"test"``: chosen and judged on the test split, so
    ``point`` is optimistic (a hospital without a validation split). ``chosen``: the point on the split that chose
    it (``point`` itself when that is the test split); ``bound``: the lower end of the 95% interval of the
    sensitivity there (`sensitivity_bound`), at least the target for a proposed threshold; ``naive``: the highest
    threshold whose sensitivity alone reaches the target (`threshold_for_sensitivity`), the one chosen without a
    margin; ``slides``: the abnormal slides of the choosing split (``None`` when the tile names do not say).
    """

    target: float
    point: OperatingPoint
    split: str = "test"
    chosen: OperatingPoint | None = None
    bound: float = math.nan
    naive: float | None = None
    slides: int | None = None

    @property
    def threshold(self) -> float:
        """The threshold found (a tile is abnormal at ``p >= threshold``)."""
        return self.point.threshold

    @property
    def on_split(self) -> OperatingPoint:
        """The point on the split that chose the threshold."""
        return self.point if self.chosen is None else self.chosen


@dataclass(frozen=True)
class Unreachable:
    """No threshold whose sensitivity's lower 95% bound reaches ``target`` on the choosing ``split``: the highest
    lower bound any threshold gives (``best``, reached by calling every abnormal tile or the best threshold), the
    naive threshold that reaches ``target`` on the point estimate alone, and the split's abnormal tiles and
    slides. The pages say so instead of proposing a threshold."""

    target: float
    split: str
    best: float
    naive: float | None
    tiles: int
    slides: int | None
    # set when a threshold does reach ``target`` with the margin, but only by calling most normal tiles abnormal:
    # that threshold and the split's specificity at it (`bounded_threshold`, `MIN_SPECIFICITY`)
    at: float | None = None
    specificity: float | None = None

    @property
    def words(self) -> str:
        """Why no threshold is proposed, in one sentence."""
        split = "validation" if self.split == "validation" else "test"
        if self.at is not None and self.specificity is not None:
            return (
                f"sensitivity {self.target:.2f} is shown with 95% confidence on the {split} split only at threshold "
                f"{self.at:.2f}, which calls most normal tiles abnormal (specificity {self.specificity:.2f} there), so "
                "none is proposed: at this floor the model does not tell the classes apart well enough to be of use"
            )
        slides = "" if self.slides is None else f" from {self.slides} abnormal slide{'s' if self.slides != 1 else ''}"
        naive = (
            f" (threshold {self.naive:.2f} reaches it on the point estimate alone, without that margin)"
            if self.naive is not None
            else ""
        )
        return (
            f"no threshold reaches sensitivity {self.target:.2f} with 95% confidence on the {split} split: its "
            f"{self.tiles} abnormal tiles{slides} show at best a lower bound of {self.best:.2f}{naive}, so none is "
            "proposed; more abnormal slides are needed to choose one"
        )


def threshold_for_sensitivity(labels: npt.ArrayLike, probs: npt.ArrayLike, target: float) -> TargetThreshold | None:
    """The highest threshold at which at least ``target`` of the abnormal tiles are called abnormal.

    Lowering the threshold can only raise sensitivity and lower specificity, so the highest threshold that reaches
    the target is the one that keeps the most normal tiles normal. It is the k-th highest probability among the
    abnormal tiles, k = ceil(target x abnormal tiles); tiles tied with it are called abnormal too, so the sensitivity
    reached can exceed the target. ``None`` when there is no abnormal tile (sensitivity is undefined). This is the
    point estimate alone, without a margin: `bounded_threshold` is the one the pages propose.
    """
    if not (math.isfinite(target) and 0.0 < target <= 1.0):
        raise ValueError(f"target sensitivity must be in (0, 1], got {target}")
    labels = np.asarray(labels, dtype=int)
    probs = np.asarray(probs, dtype=float)
    abnormal = np.sort(probs[labels == 1])[::-1]
    if abnormal.size == 0:
        return None
    # The small tolerance keeps 0.28 x 25 = 7.000000000000001 from asking for an 8th tile.
    needed = max(1, math.ceil(target * abnormal.size - 1e-9))
    return TargetThreshold(float(target), operating_point(labels, probs, float(abnormal[needed - 1])))


Z_95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval, scipy.stats.norm.ppf(0.975)


def wilson_lower(successes: float, trials: float, z: float = Z_95) -> float:
    """The lower end of the Wilson (1927) score interval of ``successes / trials`` (Agresti & Coull 1998, eq. 2):
    (p + z^2/2n - z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n). Written out rather than taken from
    ``scipy.stats.binomtest`` (`models.decision.wilson_interval`) because ``trials`` here is an effective sample size,
    not a whole number; at whole numbers the two agree. NaN for no trials."""
    if trials <= 0:
        return math.nan
    p = successes / trials
    z2 = z * z
    centre = p + z2 / (2 * trials)
    spread = z * math.sqrt(max(p * (1 - p) / trials + z2 / (4 * trials * trials), 0.0))
    return max(0.0, (centre - spread) / (1 + z2 / trials))


def cluster_icc(hits: npt.ArrayLike, sizes: npt.ArrayLike) -> float:
    """The intra-slide correlation of a tile being caught: the analysis-of-variance estimator for binary outcomes
    in clusters (Fleiss 1981; Donner & Klar 2000, Design and Analysis of Cluster Randomization Trials, Sec. 2.5):
    rho = (MSB - MSW) / (MSB + (m0 - 1) MSW), with MSB = sum m_i (p_i - p)^2 / (k - 1), MSW = sum m_i p_i (1 - p_i)
    / (N - k), m0 = (N - sum m_i^2 / N) / (k - 1), clipped to [0, 1]. One slide cannot show how far its tiles speak
    for another: 1 (every tile of it counts as one). No variation at all (every tile caught, or none): 0."""
    y = np.asarray(hits, dtype=float)
    m = np.asarray(sizes, dtype=float)
    k, total = m.size, float(m.sum())
    if k <= 1:
        return 1.0
    if total <= k:  # one tile per slide: nothing within slides, and no clustering to correct
        return 0.0
    p_i, p = y / m, float(y.sum()) / total
    msb = float((m * (p_i - p) ** 2).sum()) / (k - 1)
    msw = float((m * p_i * (1 - p_i)).sum()) / (total - k)
    m0 = (total - float((m * m).sum()) / total) / (k - 1)
    denominator = msb + (m0 - 1) * msw
    if denominator <= 0:
        return 0.0
    return min(1.0, max(0.0, (msb - msw) / denominator))


def sensitivity_bound(hits: npt.ArrayLike, sizes: npt.ArrayLike) -> float:
    """The lower end of the 95% interval of a tile sensitivity whose abnormal tiles come in slides (``sizes``
    abnormal tiles per slide, ``hits`` of them called abnormal): the Wilson interval (`wilson_lower`) on the
    effective number of tiles N / deff, deff = 1 + (m - 1) rho the design effect of cluster sampling (Kish 1965,
    Survey Sampling, Sec. 5.4; m = sum m_i^2 / N, rho = `cluster_icc`). Tiles of one slide are not independent:
    where slides differ, a few slides count as little more than a few tiles, which is what a threshold chosen on
    one or two slides needs to be held to."""
    y = np.asarray(hits, dtype=float)
    m = np.asarray(sizes, dtype=float)
    total = float(m.sum())
    if total <= 0:
        return math.nan
    size = float((m * m).sum()) / total
    effective = total / (1.0 + (size - 1.0) * cluster_icc(y, m))
    return wilson_lower(float(y.sum()) / total * effective, effective)


def bounded_threshold(
    labels: npt.ArrayLike, probs: npt.ArrayLike, target: float, keys: Sequence[str] | None = None
) -> TargetThreshold | Unreachable | None:
    """The highest threshold at which the lower end of the 95% interval of the sensitivity (`sensitivity_bound`,
    abnormal tiles grouped by slide ``keys``; each tile its own slide when the names do not say) reaches
    ``target``: the floor with a margin. Scans every abnormal tile's probability from the highest down (the bound
    need not grow steadily as the threshold falls: rho changes). `Unreachable` when none does, or when the first one
    that does keeps a specificity below `MIN_SPECIFICITY` on the same tiles (every tile of a few slides caught only
    when nearly everything is called abnormal: no disagreement between slides is left to estimate, so the bound is
    at its most generous exactly there); ``None`` without an abnormal tile."""
    naive = threshold_for_sensitivity(labels, probs, target)
    if naive is None:
        return None
    y = np.asarray(labels, dtype=int)
    p = np.asarray(probs, dtype=float)
    abnormal = y == 1
    slide_of = (
        np.arange(int(abnormal.sum()))
        if keys is None
        else np.unique(np.asarray(keys, dtype=object).astype(str)[abnormal], return_inverse=True)[1]
    )
    scores = p[abnormal]
    sizes = np.bincount(slide_of).astype(float)
    best = -1.0
    for candidate in np.unique(scores)[::-1]:
        bound = sensitivity_bound(np.bincount(slide_of, weights=scores >= candidate, minlength=sizes.size), sizes)
        best = max(best, bound)
        if bound >= target:
            slides = None if keys is None else int(sizes.size)
            point = operating_point(y, p, float(candidate))
            if point.normal and point.specificity < MIN_SPECIFICITY:
                return Unreachable(
                    float(target), "test", bound, naive.threshold, int(abnormal.sum()), slides, float(candidate),
                    point.specificity,
                )  # fmt: skip
            return TargetThreshold(float(target), point, "test", None, bound, naive.threshold, slides)
    slides = None if keys is None else int(sizes.size)
    return Unreachable(float(target), "test", best, naive.threshold, int(abnormal.sum()), slides)


def _keys(rows: pd.DataFrame) -> list[str] | None:
    return slides_of_tiles(rows["path"].to_numpy()) if "path" in rows.columns else None


def chosen_target(
    labels: npt.ArrayLike,
    probs: npt.ArrayLike,
    target: float,
    val_rows: pd.DataFrame | None = None,
    keys: Sequence[str] | None = None,
) -> TargetThreshold | Unreachable | None:
    """The threshold proposed to reach ``target`` (`bounded_threshold`, with its margin): chosen on ``val_rows``
    (the hospital's validation predictions) when they hold an abnormal tile, its ``point`` then the test split's at
    it (``chosen`` the validation split's); else chosen on the test split itself (``keys``: its tiles' slides),
    optimistic. `Unreachable` when no threshold reaches it with 95% confidence on the choosing split."""
    if val_rows is not None and len(val_rows) and (val_rows["label"].to_numpy(dtype=int) == 1).any():
        found = bounded_threshold(
            val_rows["label"].to_numpy(dtype=int),
            val_rows["prob_abnormal"].to_numpy(dtype=float),
            target,
            _keys(val_rows),
        )
        if isinstance(found, Unreachable):
            return replace(found, split="validation")
        if found is None:
            return None
        test = operating_point(np.asarray(labels, dtype=int), np.asarray(probs, dtype=float), found.threshold)
        return replace(found, point=test, split="validation", chosen=found.point)
    return bounded_threshold(labels, probs, target, keys)


def auc_warning(
    auc: float | None, point: OperatingPoint, min_auc: float = WARN_AUC, min_rate: float = WARN_RATE
) -> str | None:
    """A plain sentence when a good AUC hides a poor operating point, else ``None``.

    The rule: AUC at least ``min_auc`` while sensitivity or specificity at ``point.threshold`` is below
    ``min_rate``. AUC only says how well tiles are *ranked*; the threshold decides what the model *calls* them.
    """
    if auc is None or not math.isfinite(auc) or auc < min_auc:
        return None
    problems = []
    if point.abnormal and point.sensitivity < min_rate:
        problems.append(f"misses {point.fn} of {point.abnormal} abnormal tiles (sensitivity {point.sensitivity:.2f})")
    if point.normal and point.specificity < min_rate:
        problems.append(
            f"calls {point.fp} of {point.normal} normal tiles abnormal (specificity {point.specificity:.2f})"
        )
    if not problems:
        return None
    return (
        f"AUC {auc:.3f} looks good, but at threshold {point.threshold:.2f} the model {' and '.join(problems)}: "
        "it ranks tiles well, but this threshold is in the wrong place for this hospital."
    )


def proposal_words(target: TargetThreshold, slides: Slides | None = None) -> str:
    """What a proposed threshold gives, on the split that chose it and on test: ``"threshold 0.41 reaches 0.90 with
    95% confidence on validation (sensitivity 0.95, 95% CI lower bound 0.91, 4 abnormal slides); on test:
    sensitivity 0.81 (...)"``. ``slides``: the hospital's test slides (``slides.csv``'s scores) for the slides it
    would miss and flag (`consequences`)."""
    bound = f"95% CI lower bound {target.bound:.2f}" if math.isfinite(target.bound) else "no bound"
    few = "" if target.slides is None else f", {target.slides} abnormal slide{'s' if target.slides != 1 else ''}"
    test = consequences(target.point, slides).words
    if target.split == "validation":
        chosen = target.on_split
        return (
            f"threshold {target.threshold:.2f} reaches {target.target:.2f} with 95% confidence on validation "
            f"(sensitivity {chosen.sensitivity:.2f}, {bound}{few}); on test: {test}"
        )
    return (
        f"threshold {target.threshold:.2f} reaches {target.target:.2f} with 95% confidence on the test split it was "
        f"chosen on (so optimistic; {bound}{few}): {test}"
    )


@dataclass(frozen=True)
class Consequences:
    """What a threshold does on the test split: its tile ``point``, the abnormal test slides it calls normal
    (``missed``) and the normal ones it calls abnormal (``alarms``), by name, out of ``abnormal_slides`` and
    ``normal_slides`` (``None`` without slide figures)."""

    point: OperatingPoint
    missed: tuple[str, ...] = ()
    alarms: tuple[str, ...] = ()
    abnormal_slides: int | None = None
    normal_slides: int | None = None

    @property
    def misses_abnormal_slide(self) -> bool:
        """Whether an abnormal test slide would be called normal."""
        return bool(self.missed)

    @property
    def words(self) -> str:
        """``"sensitivity 0.81 (21 of 26 abnormal tiles), specificity 0.90; it misses 1 of 3 abnormal slides
        (slide_0052) and calls 2 of 5 normal slides abnormal (false alarms)"``."""
        point = self.point
        tiles = (
            f"sensitivity {point.sensitivity:.2f} ({point.tp} of {point.abnormal} abnormal tiles)"
            if point.abnormal
            else "no abnormal test tile"
        )
        if point.normal:
            tiles += (
                f", specificity {point.specificity:.2f} ({point.fp} of {point.normal} normal tiles called abnormal)"
            )
            if point.specificity < WARN_RATE:
                tiles += ": it calls most normal tissue abnormal"
        if self.abnormal_slides is None or self.normal_slides is None:
            return tiles
        if self.missed:
            names = _names(list(self.missed))
            slides = f"it misses {len(self.missed)} of {self.abnormal_slides} abnormal test slides ({names})"
        else:
            slides = f"it finds all {self.abnormal_slides} abnormal test slides"
        alarms = f"{len(self.alarms)} of {self.normal_slides} normal slides called abnormal (false alarms)"
        return f"{tiles}; {slides}, {alarms}"


def consequences(point: OperatingPoint, slides: Slides | None = None) -> Consequences:
    """`Consequences` of ``point.threshold`` on test: ``point`` (its tiles) and ``slides`` (its slides' scores, the
    top-k mean; `Slides.called`)."""
    if slides is None:
        return Consequences(point)
    called = slides.called(point.threshold)
    missed = tuple(k for k, label, c in zip(slides.keys, slides.labels, called, strict=True) if label == 1 and not c)
    alarms = tuple(k for k, label, c in zip(slides.keys, slides.labels, called, strict=True) if label == 0 and c)
    return Consequences(point, missed, alarms, int((slides.labels == 1).sum()), int((slides.labels == 0).sum()))


def target_warning(
    point: OperatingPoint, target: TargetThreshold | None, unreachable: Unreachable | None = None
) -> str | None:
    """A plain sentence when the sensitivity at ``point.threshold`` is below the target sensitivity (the clinical
    floor the user set), whatever the AUC: how many abnormal tiles are missed, the sensitivity with its 95% Wilson
    interval, and the threshold proposed to reach the target with what it gives on the split that chose it and on
    test (`proposal_words`), or why none is proposed (``unreachable``); else ``None``."""
    wanted = target.target if target is not None else unreachable.target if unreachable is not None else None
    if wanted is None or not point.abnormal or point.sensitivity >= wanted:
        return None
    reach = proposal_words(target) if target is not None else unreachable.words if unreachable is not None else ""
    return (
        f"below the target sensitivity {wanted:.2f}: at threshold {point.threshold:.2f} it misses {point.fn} "
        f"of {point.abnormal} abnormal tiles (sensitivity {point.sensitivity:.2f}, 95% CI "
        f"{interval_text(point.sensitivity_interval)}); {reach}."
    )


def accuracy_warning(
    client: int, auc: float | None, accuracy: float | None, min_auc: float = WARN_AUC, min_acc: float = WARN_ACC
) -> str | None:
    """One plain sentence sending a hospital to the Hospital page's scorecard when its AUC is at least ``min_auc``
    but its accuracy (the engine's, at threshold 0.5) is below ``min_acc``; else ``None``.

    The Federation page's form of `auc_warning`: from ``metrics.jsonl``'s figures alone it cannot tell whether
    abnormal tiles are missed or normal ones flagged, so it says where to look. A hospital without an AUC (one
    class in its test split) or accuracy gets none.
    """
    if auc is None or accuracy is None or not (math.isfinite(auc) and math.isfinite(accuracy)):
        return None
    if auc < min_auc or accuracy >= min_acc:
        return None
    return (
        f"{hospital_label(client)} ranks tiles well (AUC {auc:.2f}) but at threshold 0.5 classifies only "
        f"{accuracy:.0%} of its test tiles correctly (accuracy {accuracy:.2f}): see its operating point on the "
        "Hospital page."
    )


def latest_accuracy_warnings(metrics: pd.DataFrame) -> list[str]:
    """`accuracy_warning` for each hospital's latest round in ``metrics`` (``metrics.jsonl``'s rows: client, round,
    test_auc, test_acc), by hospital."""
    if metrics.empty:
        return []
    last = metrics.sort_values("round").groupby("client", sort=True).tail(1).sort_values("client")
    found = []
    for row in last.itertuples(index=False):
        auc = None if pd.isna(row.test_auc) else float(row.test_auc)
        acc = None if pd.isna(row.test_acc) else float(row.test_acc)
        warning = accuracy_warning(int(row.client), auc, acc)
        if warning is not None:
            found.append(warning)
    return found


@dataclass(frozen=True)
class HospitalScore:
    """One hospital's line of the scorecard: tile figures at the threshold, and the slide-level ones.

    ``slides``: its test slides (`count_slides`), ``None`` when the tile names do not say; ``slide_set``: those
    slides with their truth and top-k score (`models.decision.slide_scores`); ``slide_point``: the slide calls at
    the threshold against the slides' truth; ``auc_interval``: the tile AUC's 95% interval resampled by slide.
    """

    hospital: int
    auc: float | None
    point: OperatingPoint
    target: TargetThreshold | None
    warning: str | None
    slides: int | None = None
    slide_set: Slides | None = None
    slide_point: OperatingPoint | None = None
    slide_auc: float | None = None
    auc_interval: AucInterval | None = None
    unreachable: Unreachable | None = None


def slide_results(
    keys: list[str], labels: np.ndarray, probs: np.ndarray, threshold: float
) -> tuple[Slides, OperatingPoint, float | None]:
    """The slides of tiles named by ``keys`` (`models.decision.slide_scores`), their calls at ``threshold`` against
    their truth, and the AUC of their scores (``None`` with one class)."""
    slides = slide_scores(keys, labels, probs)
    return slides, operating_point(slides.labels, slides.scores, threshold), roc(slides.labels, slides.scores).auc


def score_hospital(
    client: int,
    rows: pd.DataFrame,
    threshold: float,
    target_sensitivity: float,
    min_slides: int = MIN_TEST_SLIDES,
    val_rows: pd.DataFrame | None = None,
    held_out: Slides | None = None,
) -> HospitalScore:
    """One hospital's `HospitalScore` from its test predictions (columns label 0/1, prob_abnormal, and path for the
    slide-level figures); the threshold reaching ``target_sensitivity`` is chosen on ``val_rows`` (its validation
    predictions) when given (`chosen_target`). ``held_out``: the hospital's test slides as ``predict`` scored them
    (``slides.csv``, `app.held_out`): when given, the slide figures are theirs, so every page names the same slide
    calls as ``predict``; else they are grouped from the test tiles."""
    labels = rows["label"].to_numpy(dtype=int)
    probs = rows["prob_abnormal"].to_numpy(dtype=float)
    auc = roc(labels, probs).auc
    point = operating_point(labels, probs, threshold)
    keys = _keys(rows)
    found_target = chosen_target(labels, probs, target_sensitivity, val_rows, keys)
    target = found_target if isinstance(found_target, TargetThreshold) else None
    unreachable = found_target if isinstance(found_target, Unreachable) else None
    slide_set = slide_point = slide_auc = interval = None
    if keys is not None:
        slide_set, slide_point, slide_auc = slide_results(keys, labels, probs, threshold)
        interval = slide_bootstrap_auc(keys, labels, probs)
    if held_out is not None:
        slide_set = held_out
        slide_point = operating_point(held_out.labels, held_out.scores, threshold)
        slide_auc = roc(held_out.labels, held_out.scores).auc
    slides = None if slide_set is None else len(slide_set.keys)
    found = (
        slides_warning(slides, min_slides),
        auc_warning(auc, point),
        target_warning(point, target, unreachable),
    )
    warnings = [w for w in found if w]
    return HospitalScore(
        int(client),
        auc,
        point,
        target,
        " ".join(warnings) or None,
        slides,
        slide_set,
        slide_point,
        slide_auc,
        interval,
        unreachable,
    )


def score_hospitals(
    predictions: pd.DataFrame,
    threshold: float,
    target_sensitivity: float,
    min_slides: int = MIN_TEST_SLIDES,
    val_predictions: pd.DataFrame | None = None,
    held_out: Mapping[int, Slides] | None = None,
) -> list[HospitalScore]:
    """Every hospital of ``predictions`` (columns client, label 0/1, prob_abnormal, path) at ``threshold``, by
    client (`score_hospital`).

    Each gets its AUC (``None`` with one class), its operating point, the threshold reaching
    ``target_sensitivity`` (with the specificity there), the warning of `auc_warning`, and its slide-level figures.
    """
    return [
        score_hospital(
            int(client),
            rows,
            threshold,
            target_sensitivity,
            min_slides,
            None if val_predictions is None else val_predictions[val_predictions["client"] == client],
            None if held_out is None else held_out.get(int(client)),
        )
        for client, rows in predictions.groupby("client", sort=True)
    ]


# --- the verdict -------------------------------------------------------------------------------------------------

PASS, REVIEW, FAIL, CANNOT_JUDGE = "pass", "review", "fail", "cannot judge"


@dataclass(frozen=True)
class Floor:
    """The clinical floor a hospital's model is judged against: the sensitivity it must reach at its operating
    threshold (tiles, and abnormal slides called abnormal), the test slides needed to judge at all, and the
    specificity below which a passing model still goes to review (it would flag most normal tissue)."""

    sensitivity: float = DEFAULT_FLOOR
    min_slides: int = MIN_TEST_SLIDES
    specificity: float = WARN_RATE

    def __post_init__(self) -> None:
        if not (0.0 < self.sensitivity <= 1.0 and 0.0 <= self.specificity <= 1.0):
            raise ValueError(
                f"the floor's sensitivity must be in (0, 1] and specificity in [0, 1], got {self.sensitivity} and "
                f"{self.specificity}"
            )
        if self.min_slides < 1:
            raise ValueError(f"the floor's minimum number of test slides must be at least 1, got {self.min_slides}")

    @property
    def lowered(self) -> bool:
        """Whether the sensitivity floor is below the default one (`DEFAULT_FLOOR`): every verdict badge says so."""
        return self.sensitivity < DEFAULT_FLOOR - 1e-9

    @property
    def words(self) -> str:
        """The floor in words, as every page and report names it."""
        return (
            f"sensitivity at least {self.sensitivity:.2f} at each hospital's own threshold, at least "
            f"{self.min_slides} test slides, review below specificity {self.specificity:.2f}"
        )


@dataclass(frozen=True)
class Verdict:
    """A hospital's verdict (``kind``: pass, review, fail or cannot judge) and its reason in one sentence."""

    hospital: int
    kind: str
    reason: str
    threshold: float


def _reach(score: HospitalScore) -> str:
    """The threshold proposed to reach the floor, with its figures on validation and on test (`proposal_words`),
    or why none is proposed."""
    if score.target is not None:
        return f"; {proposal_words(score.target, score.slide_set)}"
    if score.unreachable is not None:
        return f"; {score.unreachable.words}"
    return ""


NAMES_SHOWN = 3  # slide names a verdict's reason lists before "..."


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:NAMES_SHOWN])
    return shown + (f" and {len(keys) - NAMES_SHOWN} more" if len(keys) > NAMES_SHOWN else "")


def slide_errors(score: HospitalScore) -> tuple[list[str], list[str]]:
    """The hospital's test slides whose call at its threshold contradicts their annotation: abnormal slides called
    normal (missed) and normal slides called abnormal (false alarms), by name."""
    slides = score.slide_set
    if slides is None:
        return [], []
    called = slides.called(score.point.threshold)
    missed = [k for k, label, c in zip(slides.keys, slides.labels, called, strict=True) if label == 1 and not c]
    alarms = [k for k, label, c in zip(slides.keys, slides.labels, called, strict=True) if label == 0 and c]
    return missed, alarms


def _slide_words(score: HospitalScore, missed: list[str], alarms: list[str]) -> str:
    """``"misses 1 of 3 abnormal slides (slide_0016)"`` and the false alarms (`slide_errors`), or empty when every
    slide is right."""
    slides = score.slide_set
    if slides is None:
        return ""
    parts = []
    if missed:
        parts.append(f"misses {len(missed)} of {int(slides.labels.sum())} abnormal slides ({_names(missed)})")
    if alarms:
        normal = int((slides.labels == 0).sum())
        parts.append(f"calls {len(alarms)} of {normal} normal slides abnormal ({_names(alarms)})")
    return " and ".join(parts)


def verdict(score: HospitalScore, floor: Floor) -> Verdict:
    """Judge one hospital (its `score_hospital` at its operating threshold, the target being the floor's
    sensitivity) against ``floor``. The rule, in order:

    1. **cannot judge**: no abnormal test tile;
    2. **fail**, whatever the number of slides: the whole 95% Wilson interval of the tile sensitivity lies below
       the floor (even a few slides show that it misses too much);
    3. **cannot judge**: fewer test slides than ``floor.min_slides`` (or the tile names do not say which slides);
    4. **fail**: tile sensitivity below the floor, or abnormal test slides called normal often enough that the
       slide sensitivity is below the floor;
    5. **review**: the floor is met, but an abnormal slide is still called normal, or the lower end of the
       sensitivity's interval is below the floor (too few abnormal tiles to be sure), or the specificity is below
       ``floor.specificity``;
    6. **pass** otherwise.

    Every reason names the slides whose call contradicts their annotation (missed cancers, false alarms).
    """
    point, slides = score.point, score.slides
    threshold = point.threshold
    at = f"at threshold {threshold:.2f}"
    missed, alarms = slide_errors(score)
    wrong = _slide_words(score, missed, alarms)
    on_slides = f"; on its slides it {wrong}" if wrong else ""

    def judged(kind: str, reason: str) -> Verdict:
        return Verdict(score.hospital, kind, reason, threshold)

    if point.abnormal == 0:
        return judged(CANNOT_JUDGE, "cannot judge: its test split holds no abnormal tile.")
    ci = interval_text(point.sensitivity_interval)
    interval = point.sensitivity_interval
    misses = f"misses {point.fn} of {point.abnormal} abnormal tiles {at} (sensitivity {point.sensitivity:.2f}"
    if interval is not None and interval[1] < floor.sensitivity:
        few = "" if slides is not None and slides >= floor.min_slides else f", even from {slides or 'unknown'} slides"
        return judged(
            FAIL,
            f"{misses}, 95% CI {ci}, wholly below the floor {floor.sensitivity:.2f}{few}){on_slides}{_reach(score)}.",
        )
    if slides is None:
        return judged(
            CANNOT_JUDGE,
            "cannot judge: its tile names do not say which slide they come from, so the slides cannot be counted.",
        )
    if slides < floor.min_slides:
        return judged(
            CANNOT_JUDGE,
            f"too few slides to judge: {slides} test slide{'s' if slides != 1 else ''} ({point.abnormal + point.normal}"
            f" tiles), at least {floor.min_slides} wanted{on_slides}.",
        )
    sp = point.specificity
    spec = f", specificity {sp:.2f}" if math.isfinite(sp) else ""
    sp_slide = score.slide_point
    slide_ok = sp_slide is None or not sp_slide.abnormal or sp_slide.sensitivity >= floor.sensitivity
    if point.sensitivity < floor.sensitivity:
        return judged(FAIL, f"{misses}){on_slides}{_reach(score)}.")
    if not slide_ok:
        assert sp_slide is not None
        return judged(
            FAIL,
            f"{wrong} {at} (slide sensitivity {sp_slide.sensitivity:.2f}, below the floor {floor.sensitivity:.2f})"
            f"{_reach(score)}.",
        )
    found = (
        f"finds {point.tp} of {point.abnormal} abnormal tiles {at} (sensitivity {point.sensitivity:.2f}, 95% CI {ci})"
    )
    if missed:
        return judged(REVIEW, f"{found}{spec}, but on its slides it {wrong}: look at them before relying on it.")
    if interval is not None and interval[0] < floor.sensitivity:
        return judged(
            REVIEW,
            f"{found}{spec}, but with {point.abnormal} abnormal tiles the interval reaches below the floor "
            f"{floor.sensitivity:.2f}{on_slides}.",
        )
    if math.isfinite(sp) and sp < floor.specificity:
        return judged(
            REVIEW,
            f"{found}, but calls {point.fp} of {point.normal} normal tiles abnormal (specificity {sp:.2f}, below "
            f"{floor.specificity:.2f}){on_slides}.",
        )
    slides_found = (
        f" and {sp_slide.tp} of {sp_slide.abnormal} abnormal slides"
        if sp_slide is not None and sp_slide.abnormal
        else ""
    )
    return judged(PASS, f"{found}{slides_found}{spec}{on_slides}.")


@dataclass(frozen=True)
class Judgement:
    """One hospital judged at its operating threshold (`score_hospital`, then `verdict`): what every page, report
    and command shows for it. ``source``: where the threshold came from, in words; ``split``: which split chose it
    (``"validation"``, ``"test"``, or ``""`` by hand or the default)."""

    score: HospitalScore
    verdict: Verdict
    source: str
    split: str = ""
    floor: Floor | None = None  # the floor it was judged against (a lowered one is said on every badge)

    @property
    def hospital(self) -> int:
        """The hospital."""
        return self.score.hospital

    @property
    def threshold(self) -> float:
        """Its operating threshold (its model card's)."""
        return self.score.point.threshold


def judge(
    client: int,
    rows: pd.DataFrame,
    threshold: float,
    source: str,
    split: str,
    floor: Floor,
    val_rows: pd.DataFrame | None = None,
    held_out: Slides | None = None,
) -> Judgement:
    """One hospital's `Judgement` at its operating ``threshold`` against ``floor`` (`score_hospital` with the
    floor's sensitivity as the target, then `verdict`)."""
    score = score_hospital(client, rows, threshold, floor.sensitivity, floor.min_slides, val_rows, held_out)
    judged = verdict(score, floor)
    if held_out is not None and held_out.flags_text():  # the slides reported UNFAMILIAR or with a focus, counted
        judged = replace(judged, reason=judged.reason + held_out.flags_text())
    return Judgement(score, judged, source, split, floor)


# What decides a verdict comes first (a phone shows the first few columns beside the pinned hospital name).
SCORECARD_COLUMNS = (
    "hospital",
    "sensitivity",
    "sensitivity 95% CI",
    "missed abnormal",
    "specificity",
    "specificity 95% CI",
    "false alarms",
    "test slides",
    "missed slides",
    "slide sensitivity",
    "slide specificity",
    "AUC",
    "AUC 95% CI",
    "test tiles",
    "accuracy",
    "threshold for target",
    "sensitivity there",
    "specificity there",
)


def scorecard_table(scores: list[HospitalScore]) -> pd.DataFrame:
    """The scorecard as a table, one row per hospital; undefined figures are NaN (shown empty)."""
    nan = float("nan")
    rows = []
    for score in scores:
        point, target, slide = score.point, score.target, score.slide_point
        rows.append(
            {
                "hospital": hospital_label(score.hospital),
                "test slides": nan if score.slides is None else score.slides,
                "test tiles": point.abnormal + point.normal,
                "AUC": nan if score.auc is None else score.auc,
                "AUC 95% CI": auc_interval_text(score.auc_interval, score.slides),
                "accuracy": point.accuracy,
                "sensitivity": point.sensitivity,
                "sensitivity 95% CI": interval_text(point.sensitivity_interval),
                "specificity": point.specificity,
                "specificity 95% CI": interval_text(point.specificity_interval),
                "missed abnormal": f"{point.fn} of {point.abnormal}",
                "false alarms": f"{point.fp} of {point.normal}",
                "threshold for target": nan if target is None else target.threshold,
                "sensitivity there": nan if target is None else target.point.sensitivity,
                "specificity there": nan if target is None else target.point.specificity,
                "slide sensitivity": nan if slide is None else slide.sensitivity,
                "slide specificity": nan if slide is None else slide.specificity,
                "missed slides": "" if slide is None else f"{slide.fn} of {slide.abnormal}",
            }
        )
    return pd.DataFrame(rows, columns=list(SCORECARD_COLUMNS))


VERDICT_NAMES = {PASS: "PASS", REVIEW: "REVIEW", FAIL: "FAIL", CANNOT_JUDGE: "CANNOT JUDGE"}


def verdict_word(kind: str, floor: Floor | None = None) -> str:
    """A verdict's word for a badge or a table: ``"PASS"``, or ``"PASS at floor 0.70 (below 0.90)"`` when ``floor``
    is lowered below the default (`Floor.lowered`), so that no badge reads as a plain pass against a looser bar."""
    word = VERDICT_NAMES[kind]
    if floor is not None and floor.lowered:
        return f"{word} at floor {floor.sensitivity:.2f} (below {DEFAULT_FLOOR:.2f})"
    return word


def judgement_table(judgements: Sequence[Judgement]) -> pd.DataFrame:
    """`scorecard_table` of judged hospitals, each at its own threshold, with its verdict and threshold first."""
    table = scorecard_table([j.score for j in judgements])
    table.insert(1, "verdict", [verdict_word(j.verdict.kind, j.floor) for j in judgements])
    table.insert(2, "threshold", [j.threshold for j in judgements])
    return table


VERDICT_SUMMARY_COLUMNS = (
    "hospital",
    "verdict",
    "threshold",
    "sensitivity",
    "specificity",
    "missed abnormal slides",
    "AUC",
    "test slides",
)


def verdict_summary(judgements: Sequence[Judgement]) -> pd.DataFrame:
    """The short form of `judgement_table` the Federation and Compare pages show: each hospital's verdict,
    sensitivity and specificity at its card's threshold, the abnormal slides it misses, its AUC and slides."""
    rows = []
    for judged in judgements:
        score = judged.score
        missed, _ = slide_errors(score)
        abnormal = None if score.slide_set is None else int(score.slide_set.labels.sum())
        rows.append(
            {
                "hospital": hospital_label(judged.hospital),
                "verdict": verdict_word(judged.verdict.kind, judged.floor),
                "threshold": judged.threshold,
                "sensitivity": score.point.sensitivity,
                "specificity": score.point.specificity,
                "missed abnormal slides": "" if abnormal is None else f"{len(missed)} of {abnormal}",
                "AUC": float("nan") if score.auc is None else score.auc,
                "test slides": float("nan") if score.slides is None else score.slides,
            }
        )
    return pd.DataFrame(rows, columns=list(VERDICT_SUMMARY_COLUMNS))
