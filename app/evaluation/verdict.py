"""The scorecard of one hospital (`score_hospital`: its AUC, operating point, slide figures, the threshold proposed
for its floor and its warnings in words) and the verdict rule against a clinical floor (`verdict`, `judge`): pass,
review, fail or cannot judge, with the reason in one sentence naming the slides whose call contradicts their
annotation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from app.evaluation.metrics import OperatingPoint, operating_point, roc
from app.evaluation.threshold import TargetThreshold, Unreachable, chosen_target, slides_of_rows
from app.evaluation.words import (
    WARN_RATE,
    auc_warning,
    listed_names,
    proposal_words,
    slides_warning,
    target_warning,
)
from models.decision import AucInterval, Slides, interval_text, slide_bootstrap_auc, slide_scores

# Below this many test slides a hospital's figures are too few to judge (the Hospital page lets the user change it).
MIN_TEST_SLIDES = 5
# The default clinical floor's sensitivity (`Floor`); a floor set below it is said on every verdict badge.
DEFAULT_FLOOR = 0.90


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

    @property
    def unfamiliar_slides(self) -> int | None:
        """How many held-out test slides are reported UNFAMILIAR (`models.decision.reported_call`); ``None`` when
        not recorded (no ``slides.csv``, or one without unfamiliar shares: the bundle has no tissue description)."""
        flagged = None if self.slide_set is None else self.slide_set.unfamiliar
        return None if flagged is None else len(flagged)

    @property
    def focus_slides(self) -> int | None:
        """How many held-out test slides are called normal with a focus above the threshold (review); ``None`` when
        not recorded (no ``slides.csv``, or one written before the top tile was kept)."""
        flagged = None if self.slide_set is None else self.slide_set.focus
        return None if flagged is None else len(flagged)


def slide_results(
    keys: list[str], labels: np.ndarray, probs: np.ndarray, threshold: float
) -> tuple[Slides, OperatingPoint, float | None]:
    """The slides of tiles named by ``keys`` (`models.decision.slide_scores`), their calls at ``threshold`` against
    their truth, and the AUC of their scores (``None`` with one class)."""
    slides = slide_scores(keys, labels, probs)
    return slides, operating_point(slides.labels, slides.scores, threshold), roc(slides.labels, slides.scores).auc


def score_hospital(
    hospital: int,
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
    keys = slides_of_rows(rows)
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
        int(hospital),
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
            int(hospital),
            rows,
            threshold,
            target_sensitivity,
            min_slides,
            None if val_predictions is None else val_predictions[val_predictions["client"] == hospital],
            None if held_out is None else held_out.get(int(hospital)),
        )
        for hospital, rows in predictions.groupby("client", sort=True)
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
        parts.append(f"misses {len(missed)} of {int(slides.labels.sum())} abnormal slides ({listed_names(missed)})")
    if alarms:
        normal = int((slides.labels == 0).sum())
        parts.append(f"calls {len(alarms)} of {normal} normal slides abnormal ({listed_names(alarms)})")
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
    hospital: int,
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
    score = score_hospital(hospital, rows, threshold, floor.sensitivity, floor.min_slides, val_rows, held_out)
    judged = verdict(score, floor)
    if held_out is not None and held_out.flags_text():  # the slides reported UNFAMILIAR or with a focus, counted
        judged = replace(judged, reason=judged.reason + held_out.flags_text())
    return Judgement(score, judged, source, split, floor)
