"""The Hospital page's scorecard: the operating-point maths with hand-checked numbers on unequal hospitals (ties
included), and the page itself through AppTest on a run where a high AUC hides a poor sensitivity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard import open_page, write_config, write_metrics, write_prepared, write_summary

from app.evaluation.metrics import OperatingPoint, count_slides, operating_point, slide_key
from app.evaluation.tables import scorecard_table
from app.evaluation.threshold import (
    Z_95,
    TargetThreshold,
    Unreachable,
    bounded_threshold,
    chosen_target,
    cluster_icc,
    sensitivity_bound,
    threshold_for_sensitivity,
)
from app.evaluation.verdict import score_hospitals
from app.evaluation.words import (
    accuracy_warning,
    auc_warning,
    consequences,
    latest_accuracy_warnings,
    proposal_words,
    slides_warning,
    target_warning,
)
from models.decision import interval_text, slides_of_tiles, wilson_interval

# Hospital 0 is fine; hospital 1 ranks its tiles well (AUC 0.925) but calls 3 of its 4 abnormal tiles normal at
# 0.5. Hospital 1's abnormal 0.30 ties with a normal 0.30 (half a pair in the AUC; both called abnormal at 0.30).
PROBS = {
    0: {"abnormal": [0.9, 0.8, 0.7, 0.6, 0.55], "normal": [0.1, 0.2, 0.3, 0.65, 0.4]},
    1: {"abnormal": [0.45, 0.40, 0.30, 0.60], "normal": [0.10, 0.20, 0.35, 0.05, 0.30]},
}


def _arrays(client: int) -> tuple[list[int], list[float]]:
    probs = PROBS[client]
    return [1] * len(probs["abnormal"]) + [0] * len(probs["normal"]), probs["abnormal"] + probs["normal"]


# --- the maths ---------------------------------------------------------------------------------------------------


def test_operating_point_counts_a_tie_with_the_threshold_as_abnormal() -> None:
    point = operating_point([1, 1, 1, 0, 0], [0.9, 0.5, 0.2, 0.5, 0.1], 0.5)
    assert (point.tp, point.fn, point.tn, point.fp) == (2, 1, 1, 1)
    assert point.sensitivity == 2 / 3
    assert point.specificity == 1 / 2
    assert point.accuracy == 3 / 5
    assert (point.abnormal, point.normal) == (3, 2)


def test_operating_point_rates_without_a_class_are_nan() -> None:
    point = operating_point([0, 0, 0], [0.7, 0.2, 0.1], 0.5)
    assert math.isnan(point.sensitivity)
    assert point.specificity == 2 / 3
    assert point.accuracy == 2 / 3


def test_threshold_for_sensitivity_on_unequal_hospitals() -> None:
    labels, probs = _arrays(1)
    found = threshold_for_sensitivity(labels, probs, 0.9)
    assert found is not None
    # ceil(0.9 x 4) = 4 abnormal tiles needed: the 4th highest abnormal probability, 0.30.
    assert found.threshold == 0.30
    assert found.point.sensitivity == 1.0
    assert found.point.specificity == 3 / 5  # the normal tile at 0.30 ties and is called abnormal, as is 0.35
    labels, probs = _arrays(0)
    found = threshold_for_sensitivity(labels, probs, 0.9)
    assert found is not None
    assert found.threshold == 0.55  # ceil(0.9 x 5) = 5
    assert (found.point.sensitivity, found.point.specificity) == (1.0, 4 / 5)
    found = threshold_for_sensitivity(labels, probs, 0.5)
    assert found is not None
    assert found.threshold == 0.7  # ceil(2.5) = 3: the 3rd highest
    assert (found.point.sensitivity, found.point.specificity) == (3 / 5, 1.0)


def test_threshold_for_sensitivity_with_tied_abnormal_tiles_overshoots_the_target() -> None:
    labels = [1, 1, 1, 1, 1, 0, 0, 0, 0]
    probs = [0.9, 0.8, 0.8, 0.3, 0.1, 0.85, 0.4, 0.2, 0.05]
    found = threshold_for_sensitivity(labels, probs, 0.4)  # 2 of 5 needed; 0.8 brings in both ties
    assert found is not None
    assert found.threshold == 0.8
    assert (found.point.tp, found.point.sensitivity) == (3, 3 / 5)
    assert found.point.specificity == 3 / 4  # only the normal 0.85 is above


def test_threshold_for_sensitivity_does_not_ask_for_one_tile_too_many() -> None:
    labels = [1] * 25 + [0] * 3
    probs = [round(1.0 - i / 25, 2) for i in range(25)] + [0.5, 0.6, 0.7]
    found = threshold_for_sensitivity(labels, probs, 0.28)  # 0.28 x 25 = 7.000000000000001 in floats
    assert found is not None
    assert found.point.tp == 7
    assert found.threshold == 0.76


def test_threshold_for_sensitivity_edge_cases() -> None:
    assert threshold_for_sensitivity([0, 0], [0.2, 0.3], 0.9) is None  # no abnormal tile
    with pytest.raises(ValueError, match="target sensitivity"):
        threshold_for_sensitivity([1, 0], [0.2, 0.3], 0.0)
    found = threshold_for_sensitivity([1, 0], [0.2, 0.3], 1.0)
    assert found is not None
    assert (found.threshold, found.point.specificity) == (0.2, 0.0)


def test_auc_warning_rule() -> None:
    missed = OperatingPoint(0.5, tp=1, fn=16, tn=15, fp=0)
    text = auc_warning(0.937, missed)
    assert text is not None
    assert "AUC 0.937" in text
    assert "at threshold 0.50" in text
    assert "misses 16 of 17 abnormal tiles (sensitivity 0.06)" in text
    assert "normal tiles abnormal" not in text
    assert auc_warning(0.79, missed) is None  # below the AUC that makes the number reassuring
    assert auc_warning(None, missed) is None
    flagged = OperatingPoint(0.3, tp=9, fn=1, tn=2, fp=8)
    text = auc_warning(0.8, flagged)
    assert text is not None
    assert "calls 8 of 10 normal tiles abnormal (specificity 0.20)" in text
    assert "misses" not in text
    both = OperatingPoint(0.5, tp=1, fn=2, tn=1, fp=3)
    text = auc_warning(0.9, both)
    assert text is not None
    assert "misses 2 of 3" in text
    assert "calls 3 of 4" in text
    fine = OperatingPoint(0.5, tp=1, fn=1, tn=1, fp=1)  # exactly 0.5 is not below 0.5
    assert auc_warning(0.95, fine) is None


def test_accuracy_warning_rule_of_the_federation_page() -> None:
    text = accuracy_warning(2, 0.937, 0.5)
    assert text == (
        "Hospital 2 ranks tiles well (AUC 0.94) but at threshold 0.5 classifies only 50% of its test tiles "
        "correctly (accuracy 0.50): see its operating point on the Hospital page."
    )
    assert accuracy_warning(0, 0.8, 0.6999) is not None  # AUC exactly 0.8 counts as high
    assert accuracy_warning(0, 0.7999, 0.2) is None
    assert accuracy_warning(0, 0.95, 0.7) is None  # accuracy exactly 0.7 is not low
    assert accuracy_warning(0, None, 0.2) is None  # one class in the test split: no AUC
    assert accuracy_warning(0, math.nan, 0.2) is None
    metrics = pd.DataFrame(
        [
            # round 1 of hospital 0 would warn, but only the latest round counts
            {"round": 1, "client": 0, "test_auc": 0.90, "test_acc": 0.40},
            {"round": 2, "client": 0, "test_auc": 0.90, "test_acc": 0.80},
            {"round": 2, "client": 1, "test_auc": 0.85, "test_acc": 0.65},
            {"round": 2, "client": 2, "test_auc": None, "test_acc": 0.10},
        ]
    )
    (only,) = latest_accuracy_warnings(metrics)
    assert only.startswith("Hospital 1 ranks tiles well (AUC 0.85)")
    assert latest_accuracy_warnings(metrics.iloc[:0]) == []


def _predictions() -> pd.DataFrame:
    rows = []
    for client in PROBS:
        labels, probs = _arrays(client)
        rows += [{"client": client, "label": y, "prob_abnormal": p} for y, p in zip(labels, probs, strict=True)]
    return pd.DataFrame(rows)


def test_score_hospitals_and_table() -> None:
    scores = score_hospitals(_predictions(), 0.5, 0.9)
    assert [s.hospital for s in scores] == [0, 1]
    fine, hidden = scores
    assert fine.auc == pytest.approx(23 / 25)
    assert fine.warning is None
    assert hidden.auc == pytest.approx(18.5 / 20)  # the tied pair counts one half
    assert (hidden.point.tp, hidden.point.fn, hidden.point.tn, hidden.point.fp) == (1, 3, 5, 0)
    assert hidden.warning is not None
    assert "misses 3 of 4 abnormal tiles (sensitivity 0.25)" in hidden.warning
    table = scorecard_table(scores).set_index("hospital")
    assert table.loc["Hospital 1", "sensitivity"] == 0.25
    assert table.loc["Hospital 1", "specificity"] == 1.0
    assert table.loc["Hospital 1", "accuracy"] == 6 / 9
    assert table.loc["Hospital 1", "missed abnormal"] == "3 of 4"
    assert table.loc["Hospital 0", "false alarms"] == "1 of 5"
    # 5 and 4 abnormal tiles cannot show 0.90 with 95% confidence (at best 5/8.84 = 0.57 and 4/7.84 = 0.51): no
    # threshold is proposed, and the warning says so
    assert math.isnan(table.loc["Hospital 1", "threshold for target"])
    assert hidden.target is None
    assert hidden.unreachable is not None
    assert "no threshold reaches sensitivity 0.90 with 95% confidence on the test split" in hidden.warning
    # at 0.50 both reach it, each by calling every abnormal tile: the lowest abnormal probability
    looser = scorecard_table(score_hospitals(_predictions(), 0.5, 0.5)).set_index("hospital")
    assert looser["threshold for target"].tolist() == [0.55, 0.30]
    assert looser["specificity there"].tolist() == [4 / 5, 3 / 5]


# --- the page ----------------------------------------------------------------------------------------------------


@pytest.fixture
def hidden_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with one finished run of two hospitals (PROBS) whose model cards decide at 0.55."""
    root = tmp_path / "data"
    dataset = root / "prepared" / "five"
    write_prepared(dataset, clients=2, per_class=5)
    run = root / "runs" / "20250301-000000-fedavg"
    write_config(run, dataset, strategy="fedavg")
    write_metrics(run)
    write_summary(run, "finished")
    for client, probs in PROBS.items():
        folder = run / "hospitals" / f"client_{client:02d}"
        folder.mkdir(parents=True)
        lines = ["client,path,label,prob_abnormal,round"]
        for label in ("abnormal", "normal"):
            for i, p in enumerate(probs[label]):
                lines.append(f"{client},client_{client:02d}/test/{label}/s{client}te{label[:2]}{i}.png,{label},{p},2")
        (folder / "predictions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (folder / "model.json").write_text(json.dumps({"threshold": 0.55, "client": client}), encoding="utf-8")
    monkeypatch.setenv("GASTRIC_FL_DATA", str(root))
    return root


def _scorecard(at: AppTest) -> pd.DataFrame:
    (frame,) = [d.value for d in at.dataframe if "specificity there" in d.value.columns]
    return frame.set_index("hospital")


EXPLORE_0 = "explore_20250301-000000-fedavg_0"  # the slider exploring hospital 0's threshold


def test_scorecard_warns_where_a_high_auc_hides_a_poor_sensitivity(hidden_root: Path) -> None:
    at = open_page("hospital")
    assert at.slider(key=EXPLORE_0).value == 0.55  # it starts at the model card's threshold
    warnings = [str(w.value) for w in at.warning]
    assert len(warnings) == 1
    assert "Hospital 1" in warnings[0]
    assert "AUC 0.925" in warnings[0]
    assert "at threshold 0.55 the model misses 3 of 4 abnormal tiles (sensitivity 0.25)" in warnings[0]
    table = _scorecard(at)
    assert table["AUC"].tolist() == pytest.approx([0.92, 0.925])
    assert table["sensitivity"].tolist() == [1.0, 0.25]
    assert table["specificity"].tolist() == [0.8, 1.0]
    assert table["threshold for target"].isna().all()  # 5 and 4 abnormal tiles cannot show 0.90 with confidence
    assert table["threshold"].tolist() == [0.55, 0.55]
    # tile names without slides: hospital 0 (5 of 5 found) cannot be judged; hospital 1 finds 1 of 4 (95% CI
    # 0.05-0.70), wholly below the floor 0.90: a fail, slides or not
    assert table["verdict"].tolist() == ["CANNOT JUDGE", "FAIL"]
    # Exploring another threshold says so, and changes neither the scorecard nor the verdict.
    at.slider(key=EXPLORE_0).set_value(0.3)
    at.run()
    assert [w for w in at.warning if "Hospital 1" in str(w.value)]
    assert _scorecard(at).equals(table)
    (info,) = [str(i.value) for i in at.info if "Exploring" in str(i.value)]
    assert info.startswith("**Exploring threshold 0.30, not saved.** There Hospital 0 would find 5 of 5 abnormal")
    assert "stay at the card's threshold 0.55 until you save one" in info
    # A looser floor is reached with 95% confidence only by calling every abnormal tile (4/7.84 = 0.51 >= 0.5).
    at.number_input(key="hospital_floor_sensitivity").set_value(0.5)
    at.run()
    table = _scorecard(at)
    assert table["threshold for target"].tolist() == [0.55, 0.30]
    assert table["sensitivity there"].tolist() == [1.0, 1.0]


def test_hospital_page_explains_auc_roc_and_the_confusion_matrix(hidden_root: Path) -> None:
    at = open_page("hospital")
    captions = " ".join(str(c.value) for c in at.caption)
    assert "randomly chosen abnormal tile" in captions  # AUC
    assert "ROC curve: for every possible threshold" in captions
    assert "Confusion matrix: at the chosen threshold" in captions
    helps = {m.label: m.help for m in at.metric}
    assert "predictions.csv" not in " ".join(str(h) for h in helps.values())
    assert "coin toss" in str(helps["AUC"])
    assert "3 of 4" not in str(helps["Sensitivity"])  # hospital 0 is the one shown first
    assert "5 of 5" in str(helps["Sensitivity"])


def test_the_threshold_starts_at_the_cards_again_after_leaving_the_page(hidden_root: Path) -> None:
    at = open_page("hospital")
    at.slider(key=EXPLORE_0).set_value(0.3)
    at.run()
    at.switch_page("views/data.py")
    at.run()
    at.switch_page("views/hospital.py")
    at.run()
    assert not at.exception
    assert at.slider(key=EXPLORE_0).value == 0.55


def test_wilson_intervals_on_small_counts() -> None:
    # hand-computed from Wilson's formula, z = 1.959964: centre (p + z^2/2n) / (1 + z^2/n), half-width
    # z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)
    low, high = wilson_interval(3, 4)  # type: ignore[misc]
    assert (low, high) == pytest.approx((0.300642, 0.954413), abs=1e-6)
    low, high = wilson_interval(17, 34)  # type: ignore[misc]
    assert (low, high) == pytest.approx((0.340693, 0.659307), abs=1e-6)
    low, high = wilson_interval(0, 10)  # type: ignore[misc]
    assert low == pytest.approx(0.0, abs=1e-12)
    assert high == pytest.approx(0.277533, abs=1e-6)
    assert wilson_interval(0, 0) is None
    assert interval_text((0.300642, 0.954413)) == "0.30\u20130.95"
    assert interval_text(None) == ""


def test_a_sensitivity_below_the_target_is_said_whatever_the_auc() -> None:
    labels = [1] * 4 + [0] * 5
    probs = [0.9, 0.4, 0.35, 0.3, 0.1, 0.2, 0.25, 0.05, 0.15]
    point = operating_point(labels, probs, 0.5)
    # at 0.90 four abnormal tiles cannot show it with 95% confidence: said, no threshold proposed
    unreachable = bounded_threshold(labels, probs, 0.9)
    assert isinstance(unreachable, Unreachable)
    text = target_warning(point, None, unreachable)
    assert text == (
        "below the target sensitivity 0.90: at threshold 0.50 it misses 3 of 4 abnormal tiles (sensitivity 0.25, "
        "95% CI 0.05\u20130.70); no threshold reaches sensitivity 0.90 with 95% confidence on the test split: its 4 "
        "abnormal tiles show at best a lower bound of 0.51 (threshold 0.30 reaches it on the point estimate alone, "
        "without that margin), so none is proposed; more abnormal slides are needed to choose one."
    )
    # at 0.50 all four are needed (4/7.84 = 0.51): threshold 0.30, chosen on test, said optimistic
    target = bounded_threshold(labels, probs, 0.5)
    assert isinstance(target, TargetThreshold)
    assert target.threshold == 0.3
    assert target_warning(point, target) == (
        "below the target sensitivity 0.50: at threshold 0.50 it misses 3 of 4 abnormal tiles (sensitivity 0.25, "
        "95% CI 0.05\u20130.70); threshold 0.30 reaches 0.50 with 95% confidence on the test split it was chosen on "
        "(so optimistic; 95% CI lower bound 0.51): sensitivity 1.00 (4 of 4 abnormal tiles), specificity 1.00 (0 of "
        "5 normal tiles called abnormal)."
    )
    assert target_warning(operating_point(labels, probs, 0.3), target) is None  # reached
    scores = score_hospitals(pd.DataFrame({"client": 0, "label": labels, "prob_abnormal": probs}), 0.5, 0.9)
    assert scores[0].warning is not None
    assert "below the target sensitivity 0.90" in scores[0].warning
    table = scorecard_table(scores)
    assert table.loc[0, "sensitivity 95% CI"] == "0.05\u20130.70"
    assert table.loc[0, "specificity 95% CI"] == "0.57\u20131.00"


def test_slides_are_counted_from_prepares_tile_names_and_too_few_are_said() -> None:
    assert slide_key("client_01/test/abnormal/00005_patient05_x00192_y00128.png") == "00005"
    assert slide_key("00012_a_b_x00000_y00064.png") == "00012"
    assert slide_key("client_00/test/abnormal/s0teab0.png") is None  # not a name prepare writes
    paths = [f"c/test/abnormal/{i:05d}_s_x{x:05d}_y00000.png" for i, x in ((3, 0), (3, 64), (8, 0), (11, 0))]
    assert count_slides(paths) == 3
    assert count_slides([*paths, "other.png"]) is None
    assert count_slides([]) is None
    assert slides_warning(3, 5) == (
        "too few slides to show it is good enough: its test tiles come from 3 slides (at least 5 wanted), and tiles "
        "of one slide are not independent."
    )
    assert slides_warning(1, 5) is not None
    assert "1 slide (" in str(slides_warning(1, 5))
    assert slides_warning(5, 5) is None
    assert slides_warning(None, 5) is None
    # on the scorecard: hospital 0's nine tiles from 3 slides, hospital 1's from 6
    frame = _predictions()
    frame["path"] = [
        f"x/{(i % 3) if c == 0 else (10 + i % 6):05d}_s_x{i:05d}_y00000.png"
        for c, i in zip(frame["client"], frame.index, strict=True)
    ]
    scores = score_hospitals(frame, 0.5, 0.9, min_slides=5)
    assert [s.slides for s in scores] == [3, 6]
    assert scores[0].warning is not None
    assert scores[0].warning.startswith("too few slides to show it is good enough: its test tiles come from 3 slides")
    assert scores[1].warning is not None
    assert "too few slides" not in scores[1].warning  # its warning is the sensitivity one
    table = scorecard_table(scores).set_index("hospital")
    assert table["test slides"].tolist() == [3, 6]
    assert score_hospitals(frame, 0.5, 0.9, min_slides=3)[0].warning is None


def _slide_rows(slides: dict[str, list[float]], label: str, split: str = "val") -> list[dict[str, object]]:
    return [
        {"client": 0, "path": f"client_00/{split}/{label}/{key}_s_x{i * 64:05d}_y00000.png", "label": int(label ==
         "abnormal"), "prob_abnormal": p}
        for key, probs in slides.items()
        for i, p in enumerate(probs)
    ]  # fmt: skip


def test_the_floor_is_reached_with_a_margin_not_on_two_slides_alone() -> None:
    """Issue 47: on two validation slides, one wholly caught and one half missed, the naive threshold reaches the
    floor on the point estimate; the slides disagree, so the tiles count as little more than two, and the proposed
    threshold is lower, where both slides are caught; at a floor no threshold can show, none is proposed."""
    one, two = [0.95, 0.96, 0.97, 0.98, 0.99] * 2, [0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65, 0.70, 0.75]
    val = pd.DataFrame(
        _slide_rows({"00001": one, "00002": two}, "abnormal") + _slide_rows({"00003": [0.1] * 10}, "normal")
    )
    labels, probs = val["label"].to_numpy(), val["prob_abnormal"].to_numpy()
    naive = threshold_for_sensitivity(labels, probs, 0.7)
    assert naive is not None
    assert (naive.threshold, naive.point.sensitivity) == (0.6, 0.7)  # 10 + 4 of 20 tiles: 0.70 on the estimate
    assert cluster_icc([10, 4], [10, 10]) > 0.5  # the two slides disagree
    assert sensitivity_bound([10, 4], [10, 10]) < 0.7  # so 0.70 is not shown with confidence
    keys = slides_of_tiles(val["path"].to_numpy())
    assert keys is not None
    found = bounded_threshold(labels, probs, 0.7, keys)
    assert isinstance(found, TargetThreshold)
    assert found.threshold == 0.35  # 19 of 20 tiles, both slides nearly whole: lower bound 0.76
    assert found.naive == 0.6
    assert found.slides == 2
    assert found.bound == pytest.approx(sensitivity_bound([10, 9], [10, 10]))
    assert found.bound >= 0.7
    # at 0.90 even all 20 tiles give 20/23.84 = 0.84: refused, and said why
    refused = bounded_threshold(labels, probs, 0.9, keys)
    assert isinstance(refused, Unreachable)
    assert refused.best == pytest.approx(20 / (20 + Z_95**2))
    assert "from 2 abnormal slides" in refused.words
    # one slide cannot show how its tiles speak for another: even wholly caught, it counts as one tile
    single = bounded_threshold([*labels[:10].tolist(), 0], [*probs[:10].tolist(), 0.1], 0.7, keys[:11])
    assert isinstance(single, Unreachable)
    assert single.best == pytest.approx(1 / (1 + Z_95**2))


def test_a_threshold_chosen_on_validation_is_judged_on_test() -> None:
    """The floor's threshold comes from the validation split, with its margin; the figures said of it are the test
    split's, slides missed and false alarms by name."""
    # validation: 6 abnormal slides of 8 tiles, each tile at 0.6 or above; the floor 0.90 is shown at 0.6
    val = pd.DataFrame(
        _slide_rows({f"{s:05d}": [0.6, 0.7, 0.8, 0.9] * 2 for s in range(6)}, "abnormal")
        + _slide_rows({"00010": [0.1] * 8}, "normal")
    )
    test = pd.DataFrame(
        _slide_rows({"00020": [0.9] * 4, "00021": [0.5] * 4}, "abnormal", "test")
        + _slide_rows({"00022": [0.65] * 4, "00023": [0.1] * 4}, "normal", "test")
    )
    labels, probs = test["label"].to_numpy(), test["prob_abnormal"].to_numpy()
    target = chosen_target(labels, probs, 0.9, val, slides_of_tiles(test["path"].to_numpy()))
    assert isinstance(target, TargetThreshold)
    assert (target.split, target.threshold, target.slides) == ("validation", 0.6, 6)
    assert target.on_split.sensitivity == 1.0  # 48 of 48 on validation, lower bound 48/51.84 = 0.93
    # on test at 0.6: 4 of 8 abnormal tiles, slide 00021 missed, 00022 a false alarm
    assert (target.point.tp, target.point.abnormal, target.point.fp, target.point.normal) == (4, 8, 4, 8)
    score = score_hospitals(test, 0.5, 0.9, min_slides=1, val_predictions=val)[0]
    assert score.target is not None
    assert proposal_words(score.target, score.slide_set) == (
        "threshold 0.60 reaches 0.90 with 95% confidence on validation (sensitivity 1.00, 95% CI lower bound 0.93, 6 "
        "abnormal slides); on test: sensitivity 0.50 (4 of 8 abnormal tiles), specificity 0.50 (4 of 8 normal tiles "
        "called abnormal); it misses 1 of 2 abnormal test slides (00021), 1 of 2 normal slides called abnormal (false "
        "alarms)"
    )
    # a validation split without an abnormal tile cannot choose: the test split does, labelled optimistic
    normal_only = val[val["label"] == 0]
    fallback = chosen_target(labels, probs, 0.5, normal_only)
    assert isinstance(fallback, TargetThreshold)
    assert fallback.split == "test"


def test_a_threshold_that_flags_most_normal_tissue_says_so() -> None:
    """A proposal reaching the floor by calling almost everything abnormal is not offered as if it were useful."""
    labels = [1] * 4 + [0] * 5
    probs = [0.9, 0.8, 0.7, 0.6, 0.65, 0.7, 0.2, 0.75, 0.62]
    low = consequences(operating_point(labels, probs, 0.6))
    assert low.words == (
        "sensitivity 1.00 (4 of 4 abnormal tiles), specificity 0.20 (4 of 5 normal tiles called abnormal): it calls "
        "most normal tissue abnormal"
    )
    high = consequences(operating_point(labels, probs, 0.8))
    assert "most normal tissue" not in high.words  # specificity 1.00


def test_a_floor_reached_only_by_calling_most_normal_tiles_abnormal_is_said_not_proposed() -> None:
    """Issue 47: once every tile of every slide is caught the slides no longer disagree, so the margin is at its most
    generous exactly where nearly everything is called abnormal (the quick start's hospital 1 was offered 0.057 at
    floor 0.90: test specificity 0.05). Such a threshold is said, with its specificity, and not proposed."""
    val = pd.DataFrame(
        _slide_rows({"00001": [0.9] * 10, "00002": [0.2] * 10}, "abnormal")
        + _slide_rows({"00003": [0.25] * 8 + [0.1] * 2}, "normal")
    )
    labels, probs = val["label"].to_numpy(), val["prob_abnormal"].to_numpy()
    keys = slides_of_tiles(val["path"].to_numpy())
    assert sensitivity_bound([10, 10], [10, 10]) == pytest.approx(20 / (20 + Z_95**2))
    found = bounded_threshold(labels, probs, 0.8, keys)
    assert isinstance(found, Unreachable)
    assert (found.at, found.specificity) == (0.2, pytest.approx(0.2))
    assert found.best == pytest.approx(20 / (20 + Z_95**2))
    assert found.words == (
        "sensitivity 0.80 is shown with 95% confidence on the test split only at threshold 0.20, which calls most "
        "normal tiles abnormal (specificity 0.20 there), so none is proposed: at this floor the model does not tell "
        "the classes apart well enough to be of use"
    )
    # the same tiles with the normal slide below 0.2 keep their proposal
    kept = bounded_threshold(labels, np.where(labels == 1, probs, 0.1), 0.8, keys)
    assert isinstance(kept, TargetThreshold)
    assert kept.threshold == 0.2
