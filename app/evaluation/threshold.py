"""The threshold proposed to reach a target sensitivity: the point estimate alone (`threshold_for_sensitivity`),
and the floor with a margin (`bounded_threshold`: the lower end of the 95% interval of the sensitivity on the
slides' effective number of tiles, slides counted as clusters), chosen on the hospital's validation split where it
has one (`chosen_target`). A tile is called abnormal when its probability is at least the threshold
(`app.evaluation.metrics`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pandas as pd

from app.evaluation.metrics import OperatingPoint, operating_point
from models.decision import slides_of_tiles

# A threshold proposed for a sensitivity floor must keep at least this specificity on the split that chooses it:
# one that reaches the floor only by calling most normal tissue abnormal is said, not proposed (`bounded_threshold`)
MIN_SPECIFICITY = 0.5


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


def slides_of_rows(rows: pd.DataFrame) -> list[str] | None:
    """The slide of each of ``rows``' tiles (their ``path``, `models.decision.slides_of_tiles`); ``None`` without
    paths or when a name does not say."""
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
            slides_of_rows(val_rows),
        )
        if isinstance(found, Unreachable):
            return replace(found, split="validation")
        if found is None:
            return None
        test = operating_point(np.asarray(labels, dtype=int), np.asarray(probs, dtype=float), found.threshold)
        return replace(found, point=test, split="validation", chosen=found.point)
    return bounded_threshold(labels, probs, target, keys)
