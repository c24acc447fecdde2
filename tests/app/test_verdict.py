"""The verdict per hospital (app.evaluation.verdict.verdict) on hand-made test splits: a high AUC with a low
sensitivity fails, too few slides cannot be judged, a small sample meeting the floor goes to review, a large one
passes; and the slide-level figures of the scorecard."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from app.evaluation.tables import scorecard_table
from app.evaluation.verdict import CANNOT_JUDGE, FAIL, PASS, REVIEW, Floor, Verdict, judge, score_hospital, verdict


def _split(abnormal: list[list[float]], normal: list[list[float]], client: int = 0) -> pd.DataFrame:
    """Predictions of one hospital: one list of tile probabilities per abnormal slide, then per normal slide."""
    rows = []
    slides = [(1, probs) for probs in abnormal] + [(0, probs) for probs in normal]
    for index, (label, probs) in enumerate(slides):
        kind = "abnormal" if label else "normal"
        for k, p in enumerate(probs):
            path = f"client_{client:02d}/test/{kind}/{index:05d}_s{index}_x{k * 64:05d}_y00000.png"
            rows.append({"client": client, "label": label, "prob_abnormal": p, "path": path})
    return pd.DataFrame(rows)


def _judge(frame: pd.DataFrame, floor: Floor, threshold: float = 0.5) -> Verdict:
    score = score_hospital(0, frame, threshold, floor.sensitivity, floor.min_slides)
    return verdict(score, floor)


def test_high_auc_low_sensitivity_fails() -> None:
    # 3 abnormal slides whose tiles sit at 0.30-0.45, 3 normal ones at 0.05-0.20: ranked perfectly (AUC 1) but
    # all 12 abnormal tiles are below 0.5.
    frame = _split([[0.30, 0.35, 0.40, 0.45]] * 3, [[0.05, 0.10, 0.15, 0.20]] * 3)
    score = score_hospital(0, frame, 0.5, 0.9)
    assert score.auc == 1.0
    result = verdict(score, Floor())
    assert result.kind == FAIL
    # 0.9 x 12 -> the 11th highest abnormal probability, 0.30, reaches 0.90 on the estimate; but 12 tiles, all of
    # them caught, show at best 12/15.84 = 0.76 on the lower end of the interval: none is proposed
    assert result.reason == (
        "misses 12 of 12 abnormal tiles at threshold 0.50 (sensitivity 0.00, 95% CI 0.00\u20130.24, wholly below "
        "the floor 0.90); on its slides it misses 3 of 3 abnormal slides (00000, 00001, 00002); no threshold reaches "
        "sensitivity 0.90 with 95% confidence on the test split: its 12 abnormal tiles from 3 abnormal slides show at "
        "best a lower bound of 0.76 (threshold 0.30 reaches it on the point estimate alone, without that margin), so "
        "none is proposed; more abnormal slides are needed to choose one."
    )


def test_missed_slide_fails_although_tiles_meet_the_floor() -> None:
    # 60 of 61 abnormal tiles found (0.98), but the missed one is a whole slide: 3 of 4 abnormal slides (0.75)
    frame = _split([[0.9] * 20] * 3 + [[0.2]], [[0.1] * 5] * 2)
    result = _judge(frame, Floor(sensitivity=0.9))
    assert result.kind == FAIL
    # the estimate alone reaches 0.90 at 0.90 (60 of 61), missing slide 00003; with the slides' disagreement
    # counted, the margin asks for 0.20, where every slide is caught
    assert result.reason == (
        "misses 1 of 4 abnormal slides (00003) at threshold 0.50 (slide sensitivity 0.75, below the floor 0.90); "
        "threshold 0.20 reaches 0.90 with 95% confidence on the test split it was chosen on (so optimistic; 95% CI "
        "lower bound 0.94, 4 abnormal slides): sensitivity 1.00 (61 of 61 abnormal tiles), specificity 1.00 (0 of 10 "
        "normal tiles called abnormal); it finds all 4 abnormal test slides, 0 of 2 normal slides called abnormal "
        "(false alarms)."
    )
    # Meeting a lower floor, the missed cancer slide still keeps it from passing, and is named in the reason.
    lower = _judge(frame, Floor(sensitivity=0.75))
    assert lower.kind == REVIEW
    assert lower.reason == (
        "finds 60 of 61 abnormal tiles at threshold 0.50 (sensitivity 0.98, 95% CI 0.91\u20131.00), specificity "
        "1.00, but on its slides it misses 1 of 4 abnormal slides (00003): look at them before relying on it."
    )


def test_interval_wholly_below_the_floor_fails_whatever_the_slide_count() -> None:
    # 3 slides (the minimum is 5), 20 of 44 abnormal tiles found: Wilson 0.32-0.60, wholly below 0.90. Too few
    # slides to trust a pass, but enough to know it misses too much.
    frame = _split([[0.9] * 20 + [0.2] * 14, [0.3] * 10], [[0.1] * 10])
    result = _judge(frame, Floor())
    assert result.kind == FAIL
    assert result.reason == (
        "misses 24 of 44 abnormal tiles at threshold 0.50 (sensitivity 0.45, 95% CI 0.32\u20130.60, wholly below "
        "the floor 0.90, even from 3 slides); on its slides it misses 1 of 2 abnormal slides (00001); threshold "
        "0.20 reaches 0.90 with 95% confidence on the test split it was chosen on (so optimistic; 95% CI lower bound "
        "0.92, 2 abnormal slides): sensitivity 1.00 (44 of 44 abnormal tiles), specificity 1.00 (0 of 10 normal tiles "
        "called abnormal); it finds all 2 abnormal test slides, 0 of 1 normal slides called abnormal (false alarms)."
    )
    # The same tiles against a floor its interval reaches: too few slides to judge, the missed slide still named.
    reachable = _judge(frame, Floor(sensitivity=0.55))
    assert reachable.kind == CANNOT_JUDGE
    assert reachable.reason.endswith("at least 5 wanted; on its slides it misses 1 of 2 abnormal slides (00001).")


def test_too_few_slides_cannot_be_judged() -> None:
    frame = _split([[0.9, 0.8]] * 2, [[0.1]])
    result = _judge(frame, Floor(min_slides=5))
    assert result.kind == CANNOT_JUDGE
    assert result.reason == "too few slides to judge: 3 test slides (5 tiles), at least 5 wanted."


def test_small_sample_meeting_the_floor_goes_to_review() -> None:
    frame = _split([[0.9, 0.8]] * 5, [[0.1, 0.2]] * 5)  # 10 of 10 abnormal tiles: Wilson 0.72-1.00
    result = _judge(frame, Floor())
    assert result.kind == REVIEW
    assert result.reason == (
        "finds 10 of 10 abnormal tiles at threshold 0.50 (sensitivity 1.00, 95% CI 0.72\u20131.00), specificity "
        "1.00, but with 10 abnormal tiles the interval reaches below the floor 0.90."
    )


def test_low_specificity_goes_to_review() -> None:
    frame = _split([[0.9] * 12] * 5, [[0.6] * 12] * 4 + [[0.1] * 12])
    result = _judge(frame, Floor())
    assert result.kind == REVIEW
    assert "calls 48 of 60 normal tiles abnormal (specificity 0.20, below 0.50)" in result.reason


def test_large_sample_passes() -> None:
    frame = _split([[0.95] * 12] * 5, [[0.05] * 12] * 5)  # 60 of 60: Wilson lower end 0.94
    result = _judge(frame, Floor())
    assert result.kind == PASS
    assert result.reason == (
        "finds 60 of 60 abnormal tiles at threshold 0.50 (sensitivity 1.00, 95% CI 0.94\u20131.00) and 5 of 5 "
        "abnormal slides, specificity 1.00."
    )
    assert result.threshold == 0.5


def test_slide_level_scorecard_columns() -> None:
    frame = _split([[0.9, 0.6], [0.4]], [[0.5, 0.1]])
    score = score_hospital(0, frame, 0.5, 0.9, min_slides=1)
    assert score.slides == 3
    assert score.slide_point is not None
    assert (score.slide_point.tp, score.slide_point.fn, score.slide_point.tn, score.slide_point.fp) == (1, 1, 1, 0)
    assert score.slide_auc == 1.0  # slide scores 0.75, 0.4 against 0.3
    assert score.auc_interval is None  # 3 slides, one of them normal: too few to resample
    row = scorecard_table([score]).iloc[0]
    assert row["missed slides"] == "1 of 2"
    assert row["slide sensitivity"] == 0.5
    assert row["slide specificity"] == 1.0
    assert row["AUC 95% CI"] == "cannot be estimated from 3 slides (at least 5, 2 of each class, wanted)"


def test_floor_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="sensitivity must be in"):
        Floor(sensitivity=0.0)
    with pytest.raises(ValueError, match="at least 1"):
        Floor(min_slides=0)


def test_the_verdict_counts_slides_reported_unfamiliar_or_with_a_focus() -> None:
    """Issue 47: the held-out slides (slides.csv) reported UNFAMILIAR or normal with a focus above the threshold are
    counted and named at the end of the verdict's reason; without them the reason is the plain one."""
    from app.held_out import SlideCall, as_slides

    frame = _split([[0.9] * 20] * 3, [[0.1] * 5] * 3)
    calls = [
        SlideCall("a.png", "abnormal", 0.9, "abnormal", 0.5, 20, top_tile=0.95, unfamiliar_share=0.02),
        SlideCall("grey.png", "abnormal", 0.9, "abnormal", 0.5, 20, top_tile=0.95, unfamiliar_share=0.97),
        SlideCall("n.png", "normal", 0.2, "normal", 0.5, 5, top_tile=0.7, unfamiliar_share=0.0),
        SlideCall("m.png", "normal", 0.1, "normal", 0.5, 5, top_tile=0.3, unfamiliar_share=0.0),
    ]
    held_out = as_slides(calls)
    assert held_out is not None
    plain = judge(0, frame, 0.5, "the default 0.5", "", Floor())
    flagged = judge(0, frame, 0.5, "the default 0.5", "", Floor(), held_out=held_out)
    assert flagged.verdict.reason.endswith(
        " Of the test slides, 1 UNFAMILIAR (unlike this hospital's slides, do not rely on their calls: grey.png) and "
        "1 normal with a focus above the threshold (review: n.png)."
    )
    assert "UNFAMILIAR" not in plain.verdict.reason
    # older slides.csv rows (no top tile, no share) flag nothing
    old = as_slides([SlideCall("n.png", "normal", 0.2, "normal", 0.5, 5)])
    assert old is not None
    assert old.flags_text() == ""


def test_the_scorecard_counts_unfamiliar_and_focus_slides_or_says_not_recorded() -> None:
    """Issue 47, item 1: the held-out slides reported UNFAMILIAR and normal with a focus are counted per hospital
    in the scorecard and the verdict summary; a slides.csv without what decides a flag says "not recorded"."""
    from app.evaluation.tables import FOCUS_SLIDES, UNFAMILIAR_SLIDES, verdict_summary
    from app.held_out import SlideCall, as_slides

    frame = _split([[0.9] * 20] * 3, [[0.1] * 5] * 2)
    # 5 slides: 2 mostly unfamiliar (0.80, 0.51 > 0.5; 0.50 is not above the limit), 1 normal with a tile at 0.7
    calls = [
        SlideCall("a.png", "abnormal", 0.9, "abnormal", 0.5, 20, top_tile=0.95, unfamiliar_share=0.80),
        SlideCall("b.png", "abnormal", 0.9, "abnormal", 0.5, 20, top_tile=0.95, unfamiliar_share=0.50),
        SlideCall("c.png", "abnormal", 0.9, "abnormal", 0.5, 20, top_tile=0.95, unfamiliar_share=0.51),
        SlideCall("n.png", "normal", 0.2, "normal", 0.5, 5, top_tile=0.7, unfamiliar_share=0.0),
        SlideCall("m.png", "normal", 0.1, "normal", 0.5, 5, top_tile=0.3, unfamiliar_share=0.1),
    ]
    counted = judge(0, frame, 0.5, "the default 0.5", "", Floor(), held_out=as_slides(calls))
    assert (counted.score.unfamiliar_slides, counted.score.focus_slides) == (2, 1)
    row = scorecard_table([counted.score]).iloc[0]
    assert (row[UNFAMILIAR_SLIDES], row[FOCUS_SLIDES]) == ("2", "1")
    summary = verdict_summary([counted]).iloc[0]
    assert (summary[UNFAMILIAR_SLIDES], summary[FOCUS_SLIDES]) == ("2", "1")
    # a bundle without a tissue description: no shares, top tiles kept -> unfamiliar not recorded, focus counted
    undescribed = [replace(c, unfamiliar_share=None) for c in calls]
    score = judge(0, frame, 0.5, "", "", Floor(), held_out=as_slides(undescribed)).score
    assert (score.unfamiliar_slides, score.focus_slides) == (None, 1)
    assert scorecard_table([score]).iloc[0][[UNFAMILIAR_SLIDES, FOCUS_SLIDES]].tolist() == ["not recorded", "1"]
    # an older slides.csv (six columns: neither) and no slides.csv at all (slides grouped from the test tiles)
    older = [replace(c, unfamiliar_share=None, top_tile=None) for c in calls]
    for held_out in (as_slides(older), None):
        score = judge(0, frame, 0.5, "", "", Floor(), held_out=held_out).score
        assert (score.unfamiliar_slides, score.focus_slides) == (None, None)
        row = scorecard_table([score]).iloc[0]
        assert (row[UNFAMILIAR_SLIDES], row[FOCUS_SLIDES]) == ("not recorded", "not recorded")
