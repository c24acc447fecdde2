"""`gastric-fl predict` against the run that made the bundle (issue 12, "Must show"), and its one-line errors."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.checks import every
from support.cli import run_cli
from support.slides import TinyRun

from inference import predict


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("client", [0, 1])  # hospital 1 is gray: its tiles are converted as prepare converts them
def test_predict_reproduces_the_runs_test_probabilities(tiny_run: TinyRun, tmp_path: Path, client: int) -> None:
    """Every tile the run evaluated from a normal test slide gets the probability in predictions.csv (1e-5)."""
    slides = tiny_run.slides(client, "test", "normal")
    assert slides, "the fixture needs a normal test slide for this hospital"
    source = slides[0]
    out = tmp_path / "out"
    results = predict(tiny_run.bundle(client), tiny_run.raw / source, out, progress=False)
    assert len(results) == 1
    folder = results[0].folder
    assert folder is not None

    manifest = {r["path"]: r for r in _rows(tiny_run.prepared / "manifest.csv")}
    evaluated = [
        r for r in _rows(tiny_run.bundle(client) / "predictions.csv") if manifest[r["path"]]["source"] == source
    ]
    assert evaluated
    scored = {(int(r["x"]), int(r["y"])): r for r in _rows(folder / "tiles.csv")}
    for row in evaluated:
        tile = manifest[row["path"]]
        mine = scored[(int(tile["x"]), int(tile["y"]))]
        assert int(mine["size"]) == int(tile["size"])
        assert float(mine["probability"]) == pytest.approx(float(row["prob_abnormal"]), abs=1e-5)
        assert mine["truth"] == "normal"  # the SEED mask beside it is empty

    slide = cv2.imread(str(tiny_run.raw / source), cv2.IMREAD_UNCHANGED)
    overlay = cv2.imread(str(folder / "overlay.png"), cv2.IMREAD_UNCHANGED)
    assert overlay.shape[:2] == slide.shape[:2]
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    assert summary["tiles"] == len(scored) >= len(evaluated)
    probabilities = np.array([float(r["probability"]) for r in scored.values()])
    assert summary["max_probability"] == pytest.approx(probabilities.max())
    assert summary["overlay"]["width"] == slide.shape[1]
    assert summary["overlay"]["scale"] == 1.0
    assert summary["ground_truth"]["normal_tiles"] == len(scored)


def test_predict_a_folder_outlines_annotations_and_reports_sensitivity(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = run_cli(monkeypatch, "predict", "--model", str(tiny_run.bundle(0)), "--slide", str(tiny_run.raw),
                   "--out", str(out), "--no-progress")  # fmt: skip
    assert code == 0
    names = sorted(p.stem for p in tiny_run.raw.glob("*.png") if not p.stem.endswith("_mask"))
    rows = _rows(out / "summary.csv")
    assert sorted(r["slide"] for r in rows) == names
    folders = {r["slide"]: r["folder"] for r in rows}
    assert every(re.fullmatch(rf"{name}-[0-9a-f]{{12}}", folders[name]) for name in names)
    abnormal = [s["source"].removesuffix(".png") for s in tiny_run.record["slides"] if s["label"] == "abnormal"]
    summary = json.loads((out / folders[abnormal[0]] / "summary.json").read_text(encoding="utf-8"))
    assert summary["folder"] == folders[abnormal[0]]
    truth = summary["ground_truth"]
    assert truth["abnormal_tiles"] + truth["normal_tiles"] + truth["unlabelled_tiles"] == summary["tiles"]
    assert summary["overlay"]["outline"] is not None
    assert "sensitivity" in capsys.readouterr().out
    # a second call into the same folder adds and replaces only predict's own files: a file it did not write stays
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    slide = str(tiny_run.raw / "slide_0000.png")
    model = str(tiny_run.bundle(0))
    assert run_cli(monkeypatch, "predict", "--model", model, "--slide", slide, "--out", str(out), "--no-progress") == 0
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"
    capsys.readouterr()
    # a folder predict did not make is refused as a whole
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "report.pdf").write_bytes(b"%PDF")
    assert (
        run_cli(monkeypatch, "predict", "--model", model, "--slide", slide, "--out", str(foreign), "--no-progress") == 2
    )
    _one_line_error(capsys, "did not write")
    assert sorted(p.name for p in foreign.iterdir()) == ["report.pdf"]


def _one_line_error(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: "), err
    assert "\n" not in err, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err
    return err


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("no_card", ("model.json",)),
        ("bad_json", ("not readable JSON",)),
        ("unknown_arch", ("unknown architecture",)),
        ("no_weights", ("no model.safetensors",)),
        ("wrong_shape", ("does not fit",)),
        ("missing", ("does not exist",)),
    ],
)
def test_a_bundle_that_does_not_fit_is_one_line_and_exit_2(
    tiny_run: TinyRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    damage: str,
    words: tuple[str, ...],
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_run.bundle(0), bundle, ignore=shutil.ignore_patterns("checkpoints"))
    card = json.loads((bundle / "model.json").read_text(encoding="utf-8"))
    if damage == "no_card":
        (bundle / "model.json").unlink()
    elif damage == "bad_json":
        (bundle / "model.json").write_text("{ truncated", encoding="utf-8")
    elif damage == "unknown_arch":
        (bundle / "model.json").write_text(json.dumps(card | {"architecture": "vit_huge"}), encoding="utf-8")
    elif damage == "no_weights":
        (bundle / "model.safetensors").unlink()
    elif damage == "wrong_shape":
        # the weights are MobileNetV3-Small's; a card claiming ResNet-18 does not fit them
        (bundle / "model.json").write_text(json.dumps(card | {"architecture": "resnet18"}), encoding="utf-8")
    else:
        shutil.rmtree(bundle)
    code = run_cli(monkeypatch, "predict", "--model", str(bundle), "--slide", str(tiny_run.raw / "slide_0000.png"),
                   "--out", str(tmp_path / "out"), "--no-progress")  # fmt: skip
    assert code == 2
    _one_line_error(capsys, *words)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_slide_and_a_slide_without_tissue_are_one_line_and_exit_2(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.png"
    broken.write_bytes((tiny_run.raw / "slide_0000.png").read_bytes()[:300])  # truncated PNG
    blank = tmp_path / "blank.png"
    cv2.imwrite(str(blank), np.full((256, 256, 3), 245, dtype=np.uint8))  # glass only
    text = tmp_path / "notes.tiff"
    text.write_text("not an image", encoding="utf-8")
    model = str(tiny_run.bundle(0))
    for slide, words in ((broken, ("broken.png",)), (blank, ("no tissue",)), (text, ("notes.tiff", "not a PNG"))):
        out = str(tmp_path / slide.stem)
        code = run_cli(monkeypatch, "predict", "--model", model, "--slide", str(slide), "--out", out, "--no-progress")
        assert code == 2, slide
        _one_line_error(capsys, *words)
    missing = tmp_path / "nowhere.png"
    assert run_cli(monkeypatch, "predict", "--model", model, "--slide", str(missing), "--out", str(tmp_path / "o"),
                       "--no-progress") == 2  # fmt: skip
    _one_line_error(capsys, "does not exist")
