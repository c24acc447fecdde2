"""The slide call rule, the Wilson interval and the AUC interval resampled by slide (models.decision), on a small
hand-made example whose figures are worked out in the comments."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from models import decision

# Slides A and B are abnormal, C normal; a tile's probability of abnormal:
KEYS = ["A", "A", "B", "C", "C"]
LABELS = [1, 1, 1, 0, 0]
PROBS = [0.9, 0.6, 0.4, 0.5, 0.1]


def test_slide_scores_and_calls() -> None:
    slides = decision.slide_scores(KEYS, LABELS, PROBS)
    assert slides.keys == ("A", "B", "C")
    assert slides.labels.tolist() == [1, 1, 0]
    assert slides.scores.tolist() == pytest.approx([0.75, 0.4, 0.3])  # top-5 mean = mean of all (<= 5 tiles)
    assert slides.tiles.tolist() == [2, 1, 2]
    assert slides.called(0.5).tolist() == [True, False, False]
    assert slides.called(0.4).tolist() == [True, True, False]  # "at least": a score equal to the threshold counts
    top1 = decision.slide_scores(KEYS, LABELS, PROBS, k=1)
    assert top1.scores.tolist() == pytest.approx([0.9, 0.4, 0.5])
    assert "2 highest" in decision.slide_scores(KEYS, LABELS, PROBS, k=2).rule
    assert decision.top_k_mean([0.2, 0.9, 0.4, 0.8], 2) == pytest.approx(0.85)
    with pytest.raises(ValueError, match="3 slide keys for 5 labels"):
        decision.slide_scores(KEYS[:3], LABELS, PROBS)


def test_pair_wins_is_the_mann_whitney_count() -> None:
    wins, positives, negatives = decision.pair_wins(KEYS, LABELS, PROBS)
    # A's 0.9 and 0.6 beat both of C's tiles (4 pairs); B's 0.4 beats only 0.1 (1 pair).
    assert wins.tolist() == [[0, 0, 4], [0, 0, 1], [0, 0, 0]]
    assert positives.tolist() == [2, 1, 0]
    assert negatives.tolist() == [0, 0, 2]
    assert wins.sum() / (positives.sum() * negatives.sum()) == pytest.approx(roc_auc_score(LABELS, PROBS))
    tied = decision.pair_wins(["a", "b"], [1, 0], [0.5, 0.5])[0]
    assert tied.tolist() == [[0, 0.5], [0, 0]]


def test_slide_bootstrap_auc_exact_on_given_resamples() -> None:
    resamples = np.array(
        [
            [0, 1, 2],  # every slide once: the tiles' own AUC, 5/6
            [0, 0, 2],  # A twice, C once: 8 winning pairs of 4 x 2 = 1.0
            [1, 2, 2],  # B once, C twice: 2 of 1 x 4 = 0.5
            [0, 1, 1],  # no normal tile: no AUC, left out
        ]
    )
    interval = decision.slide_bootstrap_auc(KEYS, LABELS, PROBS, resamples, min_slides=3, min_per_class=1)
    assert interval is not None
    assert interval.resamples == 3
    assert interval.slides == 3
    # np.percentile (linear) of [0.5, 5/6, 1.0] at 2.5 and 97.5: 0.5 + 0.05 x (1/3) and 5/6 + 0.95 x (1/6)
    assert interval.low == pytest.approx(0.5 + 0.05 / 3)
    assert interval.high == pytest.approx(5 / 6 + 0.95 / 6)
    assert decision.interval_text(interval) == "0.52\u20130.99"


def test_slide_bootstrap_auc_matches_sklearn_on_duplicated_tiles() -> None:
    rng = np.random.default_rng(3)
    keys = [f"s{i // 4}" for i in range(40)]
    labels = [1 if i // 4 < 5 else 0 for i in range(40)]
    probs = rng.random(40).round(2)  # rounded: ties across slides
    resamples = decision.bootstrap_resamples(10, count=25, seed=7)
    interval = decision.slide_bootstrap_auc(keys, labels, probs, resamples)
    assert interval is not None
    names = sorted(set(keys))
    expected = []
    for row in resamples:
        tiles = [i for s in row for i in range(40) if keys[i] == names[s]]
        y = [labels[i] for i in tiles]
        if len(set(y)) == 2:
            expected.append(roc_auc_score(y, [probs[i] for i in tiles]))
    assert interval.resamples == len(expected) > 0
    low, high = np.percentile(expected, [2.5, 97.5])
    assert (interval.low, interval.high) == pytest.approx((low, high))


def test_bootstrap_is_reproducible_and_undefined_cases() -> None:
    first = decision.slide_bootstrap_auc(KEYS, LABELS, PROBS, min_slides=3, min_per_class=1)
    assert first == decision.slide_bootstrap_auc(KEYS, LABELS, PROBS, min_slides=3, min_per_class=1)
    assert first is not None
    assert first.resamples > 0
    assert first.low <= first.high
    assert decision.slide_bootstrap_auc(["a", "b"], [1, 1], [0.2, 0.3]) is None  # one class
    # one abnormal and one normal slide: every usable resample has the same AUC, so no interval is given
    assert decision.slide_bootstrap_auc(["a", "b"], [1, 0], [0.9, 0.1]) is None
    assert decision.slide_bootstrap_auc(["a", "a"], [1, 0], [0.9, 0.1]) is None
    # three slides, but no given resample holds both classes
    none_mixed = np.array([[0, 0, 1], [2, 2, 2]])
    assert decision.slide_bootstrap_auc(KEYS, LABELS, PROBS, none_mixed, min_slides=3, min_per_class=1) is None


def test_auc_interval_needs_enough_slides_of_each_class() -> None:
    # By default 3 slides (2 abnormal, 1 normal) are too few: the interval would look certain; the text says so.
    assert decision.slide_bootstrap_auc(KEYS, LABELS, PROBS) is None
    assert decision.auc_interval_text(None, 3) == (
        "cannot be estimated from 3 slides (at least 5, 2 of each class, wanted)"
    )
    assert decision.auc_interval_text(None, None) == "undefined"
    # 5 slides but only one normal: still none; 6 slides, 3 of each: an interval
    five = ["a", "b", "c", "d", "e"]
    assert decision.slide_bootstrap_auc(five, [1, 1, 1, 1, 0], [0.9, 0.8, 0.7, 0.6, 0.1]) is None
    six = ["a", "b", "c", "d", "e", "f"]
    interval = decision.slide_bootstrap_auc(six, [1, 1, 1, 0, 0, 0], [0.9, 0.4, 0.7, 0.6, 0.1, 0.2])
    assert interval is not None
    assert interval.slides == 6
    assert decision.auc_interval_text(interval, 6) == decision.interval_text(interval) != ""


def test_wilson_interval_and_tile_names() -> None:
    low, high = decision.wilson_interval(3, 4)  # type: ignore[misc]
    assert (round(low, 4), round(high, 4)) == (0.3006, 0.9544)
    assert decision.wilson_interval(0, 0) is None
    assert decision.slide_of_tile("client_01/test/abnormal/00005_patient05_x00192_y00128.png") == "00005"
    assert decision.slide_of_tile("s0teab0.png") is None
    assert decision.slides_of_tiles(["00001_a_x00000_y00000.png", "x.png"]) is None


def test_weak_caveat_is_the_descriptions_last_clause_only_when_weak() -> None:
    """Issue 47: a slide scored with a description fitted on few tiles carries its caveat, as one sentence."""
    from models.decision import weak_caveat

    words = "Mahalanobis distance on x, fitted on 24 tiles; too few tiles for its 51 statistics: it may miss tissue"
    assert (
        weak_caveat({"tissue_weak": True, "tissue": words})
        == "Too few tiles for its 51 statistics: it may miss tissue."
    )
    assert weak_caveat({"tissue_weak": False, "tissue": words}) == ""
    assert weak_caveat({"tissue": words}) == ""  # an older summary.json, written before the flag
