"""A hospital's held-out test slides scored once by predict's code (`app.held_out`, ``slides.csv``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.checks import every
from support.slides import TrainedRoot, build_trained_root

from app.held_out import (
    SlideCall,
    SlideCallsError,
    calls_line,
    read_slide_calls,
    recall,
    run_slide_calls,
    score_finished,
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
    assert calls_line(1, [SlideCall("n.png", "normal", 0.7, "abnormal", 0.5, 4)]).endswith("FALSE ALARM: n.png")
    # a miss is named as one, never ticked
    assert calls[1].missed
    assert not calls[0].missed
    assert calls_line(0, calls) == (
        "hospital 0: 1 of 2 abnormal test slides called abnormal, 1 of 1 normal called normal; MISSED CANCER: b.png"
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
    assert every(len(calls) >= 2 for calls in found.values())


def test_a_deployed_hospital_scores_each_finished_run_once(trained: TrainedRoot, tmp_path: Path) -> None:
    """`score_finished` on a deployed hospital's runs folder (one folder per run): a run whose model was exported
    after its last round is scored into slides.csv (the same calls as `score_held_out`), once; a run still between
    rounds is left; a new export of a finished run is scored again."""
    import os
    import shutil

    runs = tmp_path / "runs"
    done, going = runs / "run-done", runs / "run-going"
    for folder in (done, going):
        shutil.copytree(trained.hospital(0), folder, ignore=shutil.ignore_patterns("checkpoints", SLIDES_FILE))
    record = json.loads((going / "hospital.json").read_text())
    record["config_toml"] = record["config_toml"].replace("rounds = 1\n", "rounds = 3\n")
    assert "rounds = 3\n" in record["config_toml"]
    (going / "hospital.json").write_text(json.dumps(record))
    seen: dict[Path, int] = {}
    lines = score_finished(runs, trained.prepared, 4, seen)
    expected = score_held_out(trained.hospital(0))
    assert lines == [f"run run-done: {calls_line(4, expected)}"]
    assert read_slide_calls(done / SLIDES_FILE) == expected
    assert not (going / SLIDES_FILE).exists()
    assert score_finished(runs, trained.prepared, 4, seen) == []  # once per export
    card = done / "model.json"
    later = card.stat().st_mtime_ns + 10**9
    os.utime(card, ns=(later, later))  # the model exported again
    assert score_finished(runs, trained.prepared, 4, seen) == [f"run run-done: {calls_line(4, expected)}"]
    # a damaged card: one line, not an error, and not tried again until it is written again
    card.write_text("{")
    damaged = score_finished(runs, trained.prepared, 4, seen)
    assert damaged == [
        f"run run-done: test slides not scored ({card} is not readable JSON (Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1)); train the run again (or resume it) to export the model anew)"
    ]
    assert score_finished(runs, trained.prepared, 4, seen) == []


def test_a_deployed_hospital_scores_on_the_device_its_run_trained_on(
    trained: TrainedRoot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run recorded as trained on a GPU (``run.device = "cuda"``) is scored there, not silently on the CPU; where
    the GPU is gone (here: none visible), one line says why its slides were not scored, and the hospital goes on."""
    import shutil

    import torch

    folder = tmp_path / "runs" / "run-gpu"
    shutil.copytree(trained.hospital(0), folder, ignore=shutil.ignore_patterns("checkpoints", SLIDES_FILE))
    record = json.loads((folder / "hospital.json").read_text())
    assert 'device = "cpu"\n' in record["config_toml"]
    record["config_toml"] = record["config_toml"].replace('device = "cpu"\n', 'device = "cuda"\n')
    (folder / "hospital.json").write_text(json.dumps(record))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert score_finished(tmp_path / "runs", trained.prepared, 4, {}) == [
        "run run-gpu: test slides not scored (run.device = cuda but no CUDA GPU is visible: use run.device = cpu or "
        "auto)"
    ]
    assert not (folder / SLIDES_FILE).exists()


def test_a_card_falls_back_only_to_a_dataset_with_its_tiles(tmp_path: Path) -> None:
    """`slide_view.card_dataset`: the card's own dataset when it is on this machine; otherwise the dataset given
    only when its manifest.csv is the one the card names (the demo's hospital 1 trained on its own slides as
    hospital 0: the federation's whole dataset would list hospital 0's test slides for it)."""
    from app.slide_view import card_dataset
    from infra.formats import manifest_sha256

    own, whole, copy = tmp_path / "own", tmp_path / "whole", tmp_path / "copy"
    for folder in (own, whole, copy):
        folder.mkdir()
    (own / "manifest.csv").write_text("client,split\n0,test\n")
    (whole / "manifest.csv").write_text("client,split\n0,test\n1,test\n")
    (copy / "manifest.csv").write_text("client,split\n0,test\n")
    card = {"dataset": {"path": str(own), "manifest_sha256": manifest_sha256(own)}}
    assert card_dataset(card, whole) == own  # its own dataset is here
    card["dataset"]["path"] = str(tmp_path / "gone")
    assert card_dataset(card, whole) is None  # other tiles: not a stand-in
    assert card_dataset(card, copy) == copy  # the same manifest, moved
    assert card_dataset({"dataset": {"path": str(tmp_path / "gone")}}, whole) == whole  # an older card names none
    assert card_dataset(card, tmp_path / "absent") is None


def test_held_out_slides_are_scored_on_the_device_given(trained: TrainedRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train`` scores on its run's device: the model is loaded there and the tiles are scored there."""
    import importlib

    predict_module = importlib.import_module("inference.predict")  # the package's `predict` names the function
    bundle_module = importlib.import_module("models.bundle")
    seen: list[str] = []
    load, score = bundle_module.load_bundle, predict_module.score_slide

    def spy_load(folder: Path, device: str = "cpu") -> object:
        seen.append(f"load {device}")
        return load(folder, device)

    def spy_score(*args: object, device: str = "cpu", **kwargs: object) -> object:
        seen.append(f"score {device}")
        return score(*args, device=device, **kwargs)  # type: ignore[arg-type]

    folder = trained.hospital(0)
    on_cpu = score_held_out(folder)
    monkeypatch.setattr(bundle_module, "load_bundle", spy_load)
    monkeypatch.setattr(predict_module, "score_slide", spy_score)
    assert score_held_out(folder, device="cpu:0") == on_cpu
    assert seen[0] == "load cpu:0"
    assert seen[1:] == ["score cpu:0"] * len(on_cpu)
    assert len(on_cpu) >= 2
