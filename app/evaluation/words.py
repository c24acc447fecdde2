"""The warnings and proposals in words: a good AUC that hides a poor operating point (`auc_warning`), too few
test slides (`slides_warning`), a sensitivity below the target with the threshold proposed to reach it
(`target_warning`, `proposal_words`), what a threshold does on the test split (`consequences`), and, for the
Federation page, which has only the run's AUC and accuracy, where to look (`accuracy_warning`).

A high AUC only says the tiles are ranked well; `auc_warning` says when the threshold in use still misses most
abnormal tiles or flags most normal ones, and `accuracy_warning` (the Federation page) points to where to look.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from app.datasets import hospital_label
from app.evaluation.metrics import OperatingPoint
from app.evaluation.threshold import TargetThreshold, Unreachable
from models.decision import Slides, interval_text

# The scorecard's warning rule: a hospital whose AUC reaches WARN_AUC but whose sensitivity or specificity at the
# threshold in use is below WARN_RATE gets a warning in words.
WARN_AUC = 0.8
WARN_RATE = 0.5
# The Federation page has only metrics.jsonl's figures (AUC, accuracy at threshold 0.5), no sensitivity or
# specificity: there a hospital whose AUC reaches WARN_AUC while its accuracy is below WARN_ACC is pointed to
# the scorecard.
WARN_ACC = 0.7

NAMES_SHOWN = 3  # slide names a verdict's reason lists before "..."


def listed_names(keys: list[str]) -> str:
    """The first `NAMES_SHOWN` of ``keys``, and how many more."""
    shown = ", ".join(keys[:NAMES_SHOWN])
    return shown + (f" and {len(keys) - NAMES_SHOWN} more" if len(keys) > NAMES_SHOWN else "")


def slides_warning(slides: int | None, minimum: int) -> str | None:
    """A plain sentence when a hospital's test split comes from fewer than ``minimum`` slides (its rates and AUC
    are then too uncertain to judge it by), else ``None`` (also when the slide count is unknown)."""
    if slides is None or slides >= minimum:
        return None
    return (
        f"too few slides to show it is good enough: its test tiles come from {slides} "
        f"slide{'s' if slides != 1 else ''} (at least {minimum} wanted), and tiles of one slide are not independent."
    )


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
            names = listed_names(list(self.missed))
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
    hospital: int, auc: float | None, accuracy: float | None, min_auc: float = WARN_AUC, min_acc: float = WARN_ACC
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
        f"{hospital_label(hospital)} ranks tiles well (AUC {auc:.2f}) but at threshold 0.5 classifies only "
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
