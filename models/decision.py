"""From tile probabilities to calls a pathologist can use, and how sure the figures are (issue 23).

Torch-free (NumPy; SciPy on first use), so the dashboard, the HTML report, ``gastric-fl report``, the model card
and ``gastric-fl predict`` share one rule each:

* **Tile call** (`models.bundle`): a tile is abnormal when ``P(abnormal) >= threshold``.
* **Slide call** (`slide_score`, `slide_calls`): a slide is called abnormal when the mean of its ``k`` highest tile
  probabilities (``k`` = `SLIDE_TOP_K`, all its tiles when it has fewer) is at least the same threshold. The mean of
  the top ``k`` is the usual multiple-instance pooling between the maximum (one noisy tile decides) and the mean of
  all tiles (a small cancer is averaged away); it is what ``predict`` reports as ``top_k_mean``. A slide's truth is
  abnormal when any of its tiles is (prepare keeps abnormal tiles only from annotated slides and normal tiles only
  from normal ones, FedSAF paper 001 Sec. 4.2, so a test slide's tiles share one label).
* **Wilson interval** (`wilson_interval`) for a proportion such as sensitivity: Wilson (1927), computed by SciPy.
* **AUC interval resampled by slide** (`slide_bootstrap_auc`): tiles of one slide are not independent, so the
  percentile bootstrap (Efron and Tibshirani 1993, Ch. 13) resamples whole slides with replacement (the cluster
  bootstrap) and takes the 2.5th and 97.5th percentiles of the tile AUC over the resamples that hold both classes.
  Each resample's AUC is the Mann-Whitney statistic counted per pair of slides (`pair_wins`): with ``c`` the number of
  times each slide is drawn, ``AUC = c'Wc / ((c'P)(c'N))``, where ``W[a, b]`` counts (abnormal tile of ``a``, normal
  tile of ``b``) pairs ranked right (ties one half) and ``P``/``N`` are the slides' abnormal/normal tile counts. It
  equals scikit-learn's ``roc_auc_score`` on the resample's tiles (tested), at a cost that does not grow with the
  number of resamples times tiles.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

DEFAULT_THRESHOLD = 0.5  # a new model card's decision threshold (models.bundle), until one is chosen
SLIDE_TOP_K = 5
SLIDE_RULE = "a slide is abnormal when the mean of its {k} highest tile probabilities is at least the threshold"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261124
# The AUC's interval resampled by slide needs at least this many slides, and two of each class: from fewer, every
# resample repeats the same few slides and the interval (often 1.00-1.00) would read as certainty.
MIN_BOOTSTRAP_SLIDES = 5
MIN_BOOTSTRAP_PER_CLASS = 2
# prepare's tile names: <slide index, 5 digits>_<slide stem>_x<x>_y<y>.png (pipeline.tiling.tile_name)
TILE_NAME = re.compile(r"^(\d{5})_(.*)_x\d+_y\d+\.png$")


def slide_of_tile(path: str) -> str | None:
    """The slide a tile comes from (its slide index in the prepared dataset), from the tile's file name as
    ``prepare`` writes it (`pipeline.tiling.tile_name`); ``None`` for a name of another form."""
    match = TILE_NAME.match(str(path).replace("\\", "/").rsplit("/", 1)[-1])
    return match.group(1) if match else None


def slide_stem(path: str) -> str:
    """The slide's name as prepare put it into a tile's file name (its stem, odd characters as ``_``), or the tile's
    own name when it is not of prepare's form."""
    name = str(path).replace("\\", "/").rsplit("/", 1)[-1]
    match = TILE_NAME.match(name)
    return match.group(2) if match else name


def slides_of_tiles(paths: Sequence[str] | npt.ArrayLike) -> list[str] | None:
    """`slide_of_tile` for every path; ``None`` when any name does not say (or there is none)."""
    keys = [slide_of_tile(str(p)) for p in np.asarray(paths, dtype=object).ravel()]
    if not keys or any(k is None for k in keys):
        return None
    return [str(k) for k in keys]


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion ``successes / trials`` (``None`` when ``trials`` is 0).

    Wilson (1927), as SciPy computes it (``scipy.stats.binomtest(...).proportion_ci(method="wilson")``): unlike the
    normal approximation it stays inside [0, 1] and is sensible for the small counts of one hospital's test split
    (3 of 4 abnormal tiles: 0.30 to 0.95). Tiles of one slide are not independent, so for tiles the interval is, if
    anything, too narrow: it is a floor on the uncertainty, not a bound.
    """
    if trials <= 0:
        return None
    from scipy.stats import binomtest  # a second of import: only when a figure needs it

    interval = binomtest(int(successes), int(trials)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(interval.low), float(interval.high)


def top_k_mean(probability: npt.ArrayLike, k: int = SLIDE_TOP_K) -> float:
    """Mean of the ``k`` highest values (all of them when there are fewer); NaN for none."""
    values = np.sort(np.asarray(probability, dtype=np.float64).ravel())
    if values.size == 0:
        return float("nan")
    return float(values[-min(k, values.size) :].mean())


def slide_is_abnormal(score: float, threshold: float) -> bool:
    """The slide call: abnormal when the slide's score (`top_k_mean`) is at least ``threshold``."""
    return bool(score >= threshold)


# One set of words for a slide's call and its outcome (issue 47, parts 1, 3 and 4): predict's lines and
# summary.csv, slides.csv, the Slide, Hospital and Verdict pages and the HTML report all say them through these.
MISSED_CANCER = "MISSED CANCER"  # an annotated abnormal slide called normal
FALSE_ALARM = "FALSE ALARM"  # an annotated normal slide called abnormal
UNFAMILIAR_LIMIT = 0.5  # a slide with more than this share of unfamiliar tissue is reported UNFAMILIAR
UNFAMILIAR_CALL = "UNFAMILIAR: unlike this hospital's slides; do not rely on the call"
FOCUS_CALL = "normal, with a focus above the threshold: review"
NO_DESCRIPTION = "no tissue description: cannot say whether a slide is unlike this hospital's"


def weak_caveat(summary: Mapping[str, Any]) -> str:
    """For a slide scored with a tissue description fitted on few tiles (predict's ``tissue_weak``,
    `models.shift.TissueDescription.weak`): the description's caveat, the last clause of its words, as a sentence;
    empty otherwise. Every measured miss of unfamiliar tissue was at such a description
    (benchmarks/results/shift_detection.md), so a low unfamiliar share is shown with it wherever it is shown."""
    if not summary.get("tissue_weak"):
        return ""
    return str(summary.get("tissue") or "").rsplit("; ", 1)[-1].capitalize() + "."


def outcome(truth: str, call: str) -> str:
    """`MISSED_CANCER`, `FALSE_ALARM`, or empty (the call agrees with the annotation, or there is none)."""
    if truth == "abnormal" and call == "normal":
        return MISSED_CANCER
    if truth == "normal" and call == "abnormal":
        return FALSE_ALARM
    return ""


def has_focus(call: str, top_tile: float | None, threshold: float) -> bool:
    """A slide called normal (its top-k mean below the threshold) that holds a tile at or above the threshold: a
    small focus the top-k mean averaged away (part 4)."""
    return call == "normal" and top_tile is not None and math.isfinite(top_tile) and top_tile >= threshold


def is_unfamiliar(share: float | None, limit: float = UNFAMILIAR_LIMIT) -> bool:
    """Whether a slide's unfamiliar share (`models.shift`; ``None``: no description) is above ``limit``."""
    return share is not None and math.isfinite(share) and share > limit


@dataclass(frozen=True)
class Reported:
    """How a slide's call is reported: the words, whether it asks for review, and why (flags)."""

    words: str  # UNFAMILIAR_CALL, FOCUS_CALL, "abnormal" or "normal"
    review: bool
    unfamiliar: bool
    focus: bool


def reported_call(call: str, top_tile: float | None, threshold: float, unfamiliar_share: float | None) -> Reported:
    """The words a slide's call is shown with, everywhere: a mostly unfamiliar slide is never a bare normal or
    abnormal (`UNFAMILIAR_CALL`), a normal call holding a tile at or above the threshold is `FOCUS_CALL`; both ask
    for review."""
    unfamiliar = is_unfamiliar(unfamiliar_share)
    focus = has_focus(call, top_tile, threshold)
    words = UNFAMILIAR_CALL if unfamiliar else FOCUS_CALL if focus else call
    return Reported(words=words, review=unfamiliar or focus, unfamiliar=unfamiliar, focus=focus)


@dataclass(frozen=True)
class Slides:
    """A hospital's test slides: key, truth (1 abnormal: any abnormal tile), score (top-k mean), tile count."""

    keys: tuple[str, ...]
    labels: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float64]
    tiles: npt.NDArray[np.int64]
    k: int = SLIDE_TOP_K
    # the held-out slides reported UNFAMILIAR and normal with a focus above the threshold (issue 47), by name;
    # None: not recorded (slides grouped from test tiles, or a slides.csv without unfamiliar shares / top tiles)
    unfamiliar: tuple[str, ...] | None = None
    focus: tuple[str, ...] | None = None

    def flags_text(self) -> str:
        """``"; of the test slides, 2 UNFAMILIAR (do not rely on their calls: a, b), 1 normal with a focus above the
        threshold (review: c)"``, or empty when none is."""
        parts = []
        if self.unfamiliar:
            parts.append(
                f"{len(self.unfamiliar)} UNFAMILIAR (unlike this hospital's slides, do not rely on their calls: "
                f"{', '.join(self.unfamiliar)})"
            )
        if self.focus:
            parts.append(f"{len(self.focus)} normal with a focus above the threshold (review: {', '.join(self.focus)})")
        return f" Of the test slides, {' and '.join(parts)}." if parts else ""

    def called(self, threshold: float) -> npt.NDArray[np.bool_]:
        """Which slides are called abnormal at ``threshold`` (`slide_is_abnormal`)."""
        return self.scores >= threshold

    @property
    def rule(self) -> str:
        """The slide call rule in words."""
        return SLIDE_RULE.format(k=self.k)


def slide_scores(
    keys: Sequence[str], labels: npt.ArrayLike, probability: npt.ArrayLike, k: int = SLIDE_TOP_K
) -> Slides:
    """Group tiles by slide (``keys``, one per tile): each slide's truth, `top_k_mean` score and tile count, in the
    order of the sorted keys."""
    y = np.asarray(labels, dtype=np.int64).ravel()
    p = np.asarray(probability, dtype=np.float64).ravel()
    if not (len(keys) == y.size == p.size):
        raise ValueError(f"{len(keys)} slide keys for {y.size} labels and {p.size} probabilities")
    names, inverse = np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)
    labels_out = np.zeros(len(names), dtype=np.int64)
    scores = np.zeros(len(names), dtype=np.float64)
    tiles = np.zeros(len(names), dtype=np.int64)
    for s in range(len(names)):
        mine = inverse == s
        labels_out[s] = int(y[mine].max())
        scores[s] = top_k_mean(p[mine], k)
        tiles[s] = int(mine.sum())
    return Slides(tuple(str(n) for n in names), labels_out, scores, tiles, k)


def pair_wins(
    keys: Sequence[str], labels: npt.ArrayLike, probability: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(W, P, N)`` over the sorted slide keys: ``W[a, b]`` = pairs (abnormal tile of slide ``a``, normal tile of
    slide ``b``) where the abnormal tile has the higher probability, ties counting one half; ``P``/``N``: each
    slide's abnormal/normal tile counts. The tile AUC is ``W.sum() / (P.sum() * N.sum())`` (Mann-Whitney)."""
    y = np.asarray(labels, dtype=np.int64).ravel()
    p = np.asarray(probability, dtype=np.float64).ravel()
    _, inverse = np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.size else 0
    positives = [np.sort(p[(inverse == s) & (y == 1)]) for s in range(n)]
    negatives = [np.sort(p[(inverse == s) & (y == 0)]) for s in range(n)]
    wins = np.zeros((n, n), dtype=np.float64)
    for a in range(n):
        if positives[a].size == 0:
            continue
        for b in range(n):
            if negatives[b].size == 0:
                continue
            below = np.searchsorted(negatives[b], positives[a], side="left")
            tied = np.searchsorted(negatives[b], positives[a], side="right") - below
            wins[a, b] = float(below.sum()) + 0.5 * float(tied.sum())
    counts_p = np.array([v.size for v in positives], dtype=np.float64)
    counts_n = np.array([v.size for v in negatives], dtype=np.float64)
    return wins, counts_p, counts_n


def bootstrap_resamples(
    slides: int, count: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> npt.NDArray[np.int64]:
    """``count`` resamples of ``slides`` slide indices drawn with replacement (shape ``(count, slides)``), from
    NumPy's PCG64 seeded with ``seed``: the same slides give the same interval on every machine."""
    return np.random.default_rng(seed).integers(0, slides, size=(count, slides), dtype=np.int64)


@dataclass(frozen=True)
class AucInterval:
    """A percentile interval of the AUC and how many resamples gave it (those holding both classes)."""

    low: float
    high: float
    resamples: int
    slides: int


def slide_bootstrap_auc(
    keys: Sequence[str],
    labels: npt.ArrayLike,
    probability: npt.ArrayLike,
    resamples: npt.NDArray[np.int64] | None = None,
    confidence: float = 0.95,
    min_slides: int = MIN_BOOTSTRAP_SLIDES,
    min_per_class: int = MIN_BOOTSTRAP_PER_CLASS,
) -> AucInterval | None:
    """The AUC's percentile bootstrap interval, resampling slides (see the module docstring).

    ``resamples``: rows of slide indices (into the sorted keys), `bootstrap_resamples` by default. Resamples with
    no abnormal or no normal tile have no AUC and are left out. ``None`` when the tiles hold one class, come from
    fewer than ``min_slides`` slides or fewer than ``min_per_class`` slides with abnormal (or with normal)
    tiles (a handful of slides gives every usable resample nearly the same AUC: a narrow interval, often
    1.00-1.00, that would look certain; `auc_interval_text` then says it cannot be estimated), or no resample
    holds both classes."""
    y = np.asarray(labels, dtype=np.int64).ravel()
    if y.size == 0 or len(np.unique(y)) < 2:
        return None
    wins, counts_p, counts_n = pair_wins(keys, y, probability)
    n = wins.shape[0]
    per_class = min(int((counts_p > 0).sum()), int((counts_n > 0).sum()))
    if n < min_slides or per_class < min_per_class:
        return None
    draws = bootstrap_resamples(n) if resamples is None else np.asarray(resamples, dtype=np.int64)
    weights = np.stack([np.bincount(row, minlength=n) for row in draws]).astype(np.float64)
    pairs = (weights @ counts_p) * (weights @ counts_n)
    usable = pairs > 0
    if not usable.any():
        return None
    aucs = np.einsum("ra,ab,rb->r", weights[usable], wins, weights[usable]) / pairs[usable]
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(aucs, [tail, 100.0 - tail])
    return AucInterval(float(low), float(high), int(usable.sum()), n)


def interval_text(interval: tuple[float, float] | AucInterval | None) -> str:
    """``"0.30-0.95"`` (two decimals, an en dash), or empty for an undefined interval."""
    if interval is None:
        return ""
    low, high = (interval.low, interval.high) if isinstance(interval, AucInterval) else interval
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""
    return f"{low:.2f}\u2013{high:.2f}"


def auc_interval_text(interval: AucInterval | None, slides: int | None) -> str:
    """The AUC's slide-resampled interval as `interval_text`, or, where `slide_bootstrap_auc` gives none, why:
    ``"cannot be estimated from 3 slides"`` (``slides`` known and below `MIN_BOOTSTRAP_SLIDES`, or too few of a
    class), ``"undefined"`` otherwise."""
    text = interval_text(interval)
    if text:
        return text
    if slides is None:
        return "undefined"
    return (
        f"cannot be estimated from {slides} slide{'s' if slides != 1 else ''} (at least {MIN_BOOTSTRAP_SLIDES}, "
        f"{MIN_BOOTSTRAP_PER_CLASS} of each class, wanted)"
    )


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [interval[0], interval[1]]


def uncertainty(
    labels: npt.ArrayLike, probability: npt.ArrayLike, threshold: float, keys: Sequence[str] | None
) -> dict[str, object]:
    """The figures a card or report shows next to a hospital's tile metrics at ``threshold`` (strict JSON, ``None``
    where undefined): the 95% Wilson intervals of sensitivity and specificity; and, when ``keys`` say each tile's
    slide, the test slide count, the AUC's 95% interval resampled by slide, and the slide-level results (the slide
    call rule at the same threshold: slides, abnormal/normal slides, missed abnormal slides, sensitivity,
    specificity, the AUC of the slide scores)."""
    y = np.asarray(labels, dtype=np.int64).ravel()
    p = np.asarray(probability, dtype=np.float64).ravel()
    called = p >= threshold
    tp, fn = int((called & (y == 1)).sum()), int((~called & (y == 1)).sum())
    tn, fp = int((~called & (y == 0)).sum()), int((called & (y == 0)).sum())
    out: dict[str, object] = {
        "sensitivity_ci": _pair(wilson_interval(tp, tp + fn)),
        "specificity_ci": _pair(wilson_interval(tn, tn + fp)),
        "slides": None,
        "auc_ci_by_slide": None,
        "slide_level": None,
    }
    if keys is None or y.size == 0:
        return out
    slides = slide_scores(keys, y, p)
    interval = slide_bootstrap_auc(keys, y, p)
    calls = slides.called(threshold)
    s_tp = int((calls & (slides.labels == 1)).sum())
    s_fn = int((~calls & (slides.labels == 1)).sum())
    s_tn = int((~calls & (slides.labels == 0)).sum())
    s_fp = int((calls & (slides.labels == 0)).sum())
    slide_auc = None
    if len(np.unique(slides.labels)) == 2:
        wins, pos, neg = pair_wins(list(slides.keys), slides.labels, slides.scores)
        slide_auc = float(wins.sum() / (pos.sum() * neg.sum()))
    out["slides"] = len(slides.keys)
    out["auc_ci_by_slide"] = None if interval is None else [interval.low, interval.high]
    out["slide_level"] = {
        "rule": slides.rule,
        "threshold": float(threshold),
        "slides": len(slides.keys),
        "abnormal": s_tp + s_fn,
        "normal": s_tn + s_fp,
        "missed": s_fn,
        "false_alarms": s_fp,
        "sensitivity": _rate(s_tp, s_tp + s_fn),
        "specificity": _rate(s_tn, s_tn + s_fp),
        "auc": slide_auc,
    }
    return out
