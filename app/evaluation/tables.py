"""The tables and words the pages show for judged hospitals: the scorecard (`scorecard_table`), the scorecard
with each verdict and threshold (`judgement_table`), its short form for the Federation and Compare pages
(`verdict_summary`), the held-out slides reported UNFAMILIAR or with a focus, counted (`flag_counts`: every
page, report and command that shows a verdict shows them), and a verdict's word on a badge (`verdict_word`), which
says a lowered floor."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from app.datasets import hospital_label
from app.evaluation.verdict import (
    CANNOT_JUDGE,
    DEFAULT_FLOOR,
    FAIL,
    PASS,
    REVIEW,
    Floor,
    HospitalScore,
    Judgement,
    slide_errors,
)
from models.decision import auc_interval_text, interval_text

# The held-out test slides (slides.csv, app.held_out) reported UNFAMILIAR (more than half the tissue unlike the
# hospital's own, models.shift) and called normal with a focus above the threshold (review), counted per hospital;
# NOT_RECORDED where the run's files do not say (never 0).
UNFAMILIAR_SLIDES = "unfamiliar slides"
FOCUS_SLIDES = "focus slides (review)"
NOT_RECORDED = "not recorded"
FLAG_HELP = {
    UNFAMILIAR_SLIDES: "held-out test slides with more than half their tissue unlike the hospital's own (reported "
    "UNFAMILIAR: do not rely on their calls); not recorded: the run's slides.csv holds no unfamiliar shares (the "
    "bundle has no tissue description, or the file is older) or there is no slides.csv",
    FOCUS_SLIDES: "held-out test slides called normal that hold a tile at or above the threshold (review them); not "
    "recorded: the run's slides.csv holds no top tiles (an older file) or there is no slides.csv",
}


def flag_counts(score: HospitalScore) -> dict[str, str]:
    """``{UNFAMILIAR_SLIDES: "2", FOCUS_SLIDES: "1"}`` for one hospital (`HospitalScore.unfamiliar_slides`,
    `HospitalScore.focus_slides`), each `NOT_RECORDED` where its ``slides.csv`` does not record it: the one form the
    scorecard, the verdict tables, ``gastric-fl report`` and the HTML report give them in."""
    unfamiliar, focus = score.unfamiliar_slides, score.focus_slides
    return {
        UNFAMILIAR_SLIDES: NOT_RECORDED if unfamiliar is None else str(unfamiliar),
        FOCUS_SLIDES: NOT_RECORDED if focus is None else str(focus),
    }


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
    UNFAMILIAR_SLIDES,
    FOCUS_SLIDES,
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
                **flag_counts(score),
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
    UNFAMILIAR_SLIDES,
    FOCUS_SLIDES,
    "AUC",
    "test slides",
)


def verdict_summary(judgements: Sequence[Judgement]) -> pd.DataFrame:
    """The short form of `judgement_table` the Federation and Compare pages show: each hospital's verdict,
    sensitivity and specificity at its card's threshold, the abnormal slides it misses, its held-out slides reported
    UNFAMILIAR or with a focus (`flag_counts`), its AUC and slides."""
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
                **flag_counts(score),
                "AUC": float("nan") if score.auc is None else score.auc,
                "test slides": float("nan") if score.slides is None else score.slides,
            }
        )
    return pd.DataFrame(rows, columns=list(VERDICT_SUMMARY_COLUMNS))
