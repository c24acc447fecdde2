"""Cards that must be right (issue 34, item 5): ``predict`` and ``threshold`` refuse a model card that could not
describe its weights (classes swapped, an impossible input size or normalisation, weights of another round), and
a slide of one uniform colour is scored with a warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from safetensors.torch import load_file, save_file
from support.cli import run_cli
from support.slides import TinyRun

from models.bundle import BundleError, read_card


def _bundle(tiny_run: TinyRun, tmp_path: Path, **changes: Any) -> Path:
    """A copy of hospital 0's bundle with ``changes`` made to its ``model.json`` (``preprocess.x`` for a nested
    field)."""
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_run.bundle(0), folder, ignore=shutil.ignore_patterns("slides", "checkpoints"))
    card = json.loads((folder / "model.json").read_text(encoding="utf-8"))
    for key, value in changes.items():
        if key.startswith("preprocess_"):
            card["preprocess"][key.removeprefix("preprocess_")] = value
        else:
            card[key] = value
    (folder / "model.json").write_text(json.dumps(card), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"class_names": ["abnormal", "normal"]}, "a card that swaps them would call normal tissue abnormal"),
        ({"preprocess_input_size": 1}, "input_size must be 16 to 4096 pixels"),
        ({"preprocess_std": [1e-30, 0.2, 0.2]}, "std values must be 0.01 to 10"),
        ({"preprocess_mean": [300.0, 0.4, 0.4]}, "mean values must be 0 to 1"),
    ],
)
def test_an_impossible_card_is_refused_in_one_line_naming_it(
    tiny_run: TinyRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    changes: dict[str, Any],
    words: str,
) -> None:
    folder = _bundle(tiny_run, tmp_path, **changes)
    with pytest.raises(BundleError, match=r"model\.json"):
        read_card(folder)
    slide = tiny_run.raw / "slide_0000.png"
    out = tmp_path / "out"
    assert run_cli(monkeypatch, "predict", "--model", str(folder), "--slide", str(slide), "--out", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert words in err[0]
    assert str(folder / "model.json") in err[0]
    assert not list(out.glob("*/summary.json"))


def test_threshold_refuses_a_card_whose_weights_are_of_another_round(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run, run, ignore=shutil.ignore_patterns("slides", "checkpoints"))
    folder = run / "hospitals" / "client_00"
    weights = folder / "model.safetensors"
    save_file(load_file(str(weights)), str(weights), metadata={"round": "7"})  # weights of a later round
    before = (folder / "model.json").read_bytes()
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--value", "0.3") == 2
    err = capsys.readouterr().err
    assert "is from round 7 but model.json describes round 1" in err
    assert (folder / "model.json").read_bytes() == before  # nothing saved


def test_a_uniform_slide_is_scored_with_a_warning(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grey = tmp_path / "grey.png"
    cv2.imwrite(str(grey), np.full((256, 256, 3), 150, dtype=np.uint8))
    out = tmp_path / "out"
    args = ("predict", "--model", str(tiny_run.bundle(0)), "--slide", str(grey), "--out", str(out), "--no-progress")
    assert run_cli(monkeypatch, *args) == 0
    err = capsys.readouterr().err
    assert f"{grey}: the slide is one uniform colour (pixel standard deviation 0.0)" in err
    (summary,) = out.glob("*/summary.json")
    assert "uniform colour" in json.loads(summary.read_text(encoding="utf-8"))["warning"]
    # a slide of tissue gets no such warning
    assert run_cli(monkeypatch, *args[:4], str(tiny_run.raw / "slide_0000.png"), "--out", str(tmp_path / "t")) == 0
    assert "uniform colour" not in capsys.readouterr().err
