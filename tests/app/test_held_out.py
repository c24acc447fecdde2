"""A hospital's held-out test slides scored once by predict's code (`app.held_out`, ``slides.csv``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.slides import TrainedRoot, build_trained_root

from app.held_out import (
    SlideCall,
    SlideCallsError,
    calls_line,
    read_slide_calls,
    recall,
    run_slide_calls,
    score_held_out,
    score_run,
    write_slide_calls,
)
from federation.runfiles import SLIDES_FILE
from inference.predict import predict


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedRoot:
    return build_trained_root(tmp_path_factory.mktemp("held_out"))


def test_slides_csv_equals_predicts_summary_for_the_same_slides_and_bundle(
    trained: TrainedRoot, tmp_path: Path
) -> None:
    folder = trained.hospital(0)
    calls = score_held_out(folder)
    listed = [s["source"] for s in trained.record()["slides"] if s["client"] == 0 and s["split"] == "test"]
    assert [c.slide for c in calls] == [s for s in listed if (trained.raw / s).is_file()]
    assert len(calls) >= 2
    assert read_slide_calls(folder / SLIDES_FILE) == calls
    truth = {s["source"]: s["label"] for s in trained.record()["slides"]}
    for call in calls:
        out = tmp_path / call.slide.replace("/", "_")
        result = predict(folder, trained.raw / call.slide, out, progress=False)[0]
        summary = result.summary
        assert call.score == summary["top_k_mean"]  # the same code: the same number, not a close one
        assert call.call == summary["call"]
        assert call.threshold == summary["threshold"]
        assert call.tiles == summary["tiles"]
        assert call.truth == truth[call.slide]
    card = json.loads((folder / "model.json").read_text())
    assert card["threshold"] == calls[0].threshold
    # the card names the same slide calls (gastric-fl report reads it)
    level = card["metrics"]["slide_level"]
    assert level["source"].startswith("slides.csv")
    assert level["slides"] == len(calls)
    assert level["missed"] == sum(c.missed and c.truth == "abnormal" for c in calls)
    assert level["abnormal"] == sum(c.truth == "abnormal" for c in calls)


def test_recall_rewrites_the_calls_at_a_new_threshold_from_the_stored_scores(tmp_path: Path) -> None:
    calls = [
        SlideCall("a.png", "abnormal", 0.62, "abnormal", 0.5, 9),
        SlideCall("b.png", "abnormal", 0.31, "normal", 0.5, 7),
        SlideCall("c.png", "normal", 0.2, "normal", 0.5, 8),
    ]
    write_slide_calls(tmp_path, calls)
    again = recall(tmp_path, 0.3)
    assert again is not None
    assert [(c.call, c.threshold, c.score) for c in again] == [
        ("abnormal", 0.3, 0.62),
        ("abnormal", 0.3, 0.31),
        ("normal", 0.3, 0.2),
    ]
    assert read_slide_calls(tmp_path / SLIDES_FILE) == again
    assert recall(tmp_path / "absent", 0.3) is None
    assert calls_line(1, [SlideCall("n.png", "normal", 0.7, "abnormal", 0.5, 4)]).endswith("false alarm: n.png")
    # a miss is named as one, never ticked
    assert calls[1].missed
    assert not calls[0].missed
    assert calls_line(0, calls) == (
        "hospital 0: 1 of 2 abnormal test slides called abnormal, 1 of 1 normal called normal; MISSED cancer: b.png"
    )


def test_a_damaged_slides_csv_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / SLIDES_FILE
    with pytest.raises(SlideCallsError, match="does not exist"):
        read_slide_calls(path)
    path.write_text("slide,truth,score,call,threshold,tiles\na.png,abnormal,0.9,normal,0.5,3\n", encoding="utf-8")
    with pytest.raises(SlideCallsError, match="line 2: impossible values"):  # 0.9 >= 0.5 must be called abnormal
        read_slide_calls(path)
    path.write_text("slide,call\n", encoding="utf-8")
    with pytest.raises(SlideCallsError, match="expected the columns"):
        read_slide_calls(path)


def test_score_run_scores_every_hospital_and_pages_read_them(trained: TrainedRoot) -> None:
    lines = score_run(trained.run)
    assert len(lines) == 2
    assert lines[0].startswith("hospital 0: ")
    found = run_slide_calls(trained.run)
    assert sorted(found) == [0, 1]
    assert all(len(calls) >= 2 for calls in found.values())
