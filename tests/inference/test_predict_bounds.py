"""`gastric-fl predict` on input that would make it slow, wrong or lossy (item 7 of issue 23, "bounded inputs"): a
decompression bomb is refused from its header under a memory limit, slides whose names collide never share an
output folder, a black slide warns, and a bundle with non-finite weights is refused before scoring."""

from __future__ import annotations

import csv
import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support.cli import run_cli
from support.images import bomb_png, bomb_tiff
from support.slides import TinyRun

ROOT = Path(__file__).resolve().parents[2]
# Importing torch alone maps about 3.5 GiB of address space (3 GiB is too little for it); 5 GiB leaves room for a
# normal predict and stays far below the 10 GiB a 60000 x 60000 RGB slide needs, so a decoder that tried would fail
# with a MemoryError, not with the refusal.
PREDICT_ADDRESS_SPACE = 5 * 2**30


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (PREDICT_ADDRESS_SPACE, PREDICT_ADDRESS_SPACE))


@pytest.mark.parametrize(("name", "make"), [("bomb.png", bomb_png), ("bomb.tif", bomb_tiff)])
def test_a_decompression_bomb_is_refused_in_one_line_under_a_memory_limit(
    tiny_run: TinyRun, tmp_path: Path, name: str, make: object
) -> None:
    slide = tmp_path / name
    slide.write_bytes(make(60000, 60000))  # type: ignore[operator]
    assert slide.stat().st_size < 200
    out = tmp_path / "out"
    command = [sys.executable, "-m", "app.cli", "predict", "--model", str(tiny_run.bundle(0)), "--slide", str(slide),
               "--out", str(out), "--no-progress"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT, preexec_fn=_limit_memory)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: {slide}: 60000x60000 is 3,600,000,000 pixels, more than the limit of 67,108,864 pixels; "
        "downscale it or raise --max-pixels"
    ]
    assert not list(out.glob("*/summary.json"))


def test_max_pixels_sets_predicts_limit(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slide = tiny_run.raw / "slide_0000.png"  # 256 x 256 = 65536 pixels
    model = str(tiny_run.bundle(0))
    args = ["predict", "--model", model, "--slide", str(slide), "--no-progress", "--max-pixels"]
    assert run_cli(monkeypatch, *args, "65535", "--out", str(tmp_path / "low")) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {slide}: 256x256 is 65,536 pixels, more than the limit of 65,535 pixels; "
        "downscale it or raise --max-pixels"
    ]
    assert run_cli(monkeypatch, *args, "65536", "--out", str(tmp_path / "exact")) == 0
    assert run_cli(monkeypatch, *args, str(2**30 + 1), "--out", str(tmp_path / "high")) == 2
    assert "must be a whole number of pixels from 1 to 1073741824" in capsys.readouterr().err
    assert not (tmp_path / "high").exists()


def test_slides_whose_names_collide_get_distinct_stable_output_folders(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``a b.png``/``a_b.png`` (same readable name), ``x.png``/``x.tif`` (suffix), ``d1/s.png``/``d2/s.png`` (folder):
    six different slides, six folders, each holding its own slide's results, in one call or in several."""
    slides = tmp_path / "slides"
    (slides / "d1").mkdir(parents=True)
    (slides / "d2").mkdir()
    sources = [tiny_run.raw / f"slide_{k:04d}.png" for k in range(6)]
    placed = ["a b.png", "a_b.png", "x.png", "x.tif", "d1/s.png", "d2/s.png"]
    for source, name in zip(sources, placed, strict=True):
        if name.endswith(".tif"):
            decoded = cv2.imread(str(source))
            assert decoded is not None
            tifffile.imwrite(slides / name, cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB))
        else:
            shutil.copy(source, slides / name)
    model = str(tiny_run.bundle(0))
    out = tmp_path / "out"
    assert run_cli(monkeypatch, "predict", "--model", model, "--slide", str(slides), "--out", str(out),
                   "--no-progress") == 0  # fmt: skip
    rows = _rows(out / "summary.csv")
    assert sorted(r["file"] for r in rows) == sorted(str(slides / name) for name in placed)
    folders = {r["file"]: r["folder"] for r in rows}
    assert len(set(folders.values())) == 6
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("intended use: ")
    assert lines[-1].startswith("verdict of hospital 0's model")
    # the tiny run's tissue description is fitted on a few dozen tiles: predict says it may miss unfamiliar tissue
    (tissue,) = [line for line in lines if line.startswith("tissue: ")]
    assert "too few tiles for its 51 statistics" in tissue
    printed = {line.split(":")[0] for line in lines[1:-1] if line != tissue}
    assert printed == set(folders.values())  # each slide's line names its own folder
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(folders.values())
    maxima = set()
    for file, folder in folders.items():
        summary = json.loads((out / folder / "summary.json").read_text(encoding="utf-8"))
        assert summary["file"] == file
        assert summary["folder"] == folder
        maxima.add(summary["max_probability"])
    assert len(maxima) == 6  # six different slides' results, none overwritten by another

    # one file per call: d1/s.png and d2/s.png never share a folder, and a file scored again keeps its folder
    alone = tmp_path / "alone"
    for name in ("d1/s.png", "d2/s.png", "d1/s.png"):
        assert run_cli(monkeypatch, "predict", "--model", model, "--slide", str(slides / name), "--out", str(alone),
                       "--no-progress") == 0  # fmt: skip
    kept = sorted(p for p in alone.iterdir() if p.is_dir())
    assert len(kept) == 2
    files = {json.loads((p / "summary.json").read_text(encoding="utf-8"))["file"] for p in kept}
    assert files == {str(slides / "d1/s.png"), str(slides / "d2/s.png")}
    # the digest is the file's: the same as in the folder call, whatever the readable part
    assert {p.name.rsplit("-", 1)[1] for p in kept} == {
        folders[str(slides / n)].rsplit("-", 1)[1] for n in ("d1/s.png", "d2/s.png")
    }


def test_a_black_slide_is_scored_with_a_warning(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    black = tmp_path / "black.png"
    cv2.imwrite(str(black), np.full((256, 256, 3), 10, dtype=np.uint8))  # a failed scan: dark, not near-white
    out = tmp_path / "out"
    code = run_cli(monkeypatch, "predict", "--model", str(tiny_run.bundle(0)), "--slide", str(black), "--out",
                   str(out), "--no-progress")  # fmt: skip
    assert code == 0
    warning = (
        f"{black}: the slide is black (every pixel <= 10), so its 16 tile(s) show no tissue and their probabilities "
        "mean nothing; check the scan"
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert f"warning: {warning}" in err
    (summary,) = out.glob("black-*/summary.json")
    assert json.loads(summary.read_text(encoding="utf-8"))["warning"] == warning
    # a slide just above the black level is no black slide; being one colour, it is warned as uniform instead
    cv2.imwrite(str(black), np.full((256, 256, 3), 11, dtype=np.uint8))
    assert run_cli(monkeypatch, "predict", "--model", str(tiny_run.bundle(0)), "--slide", str(black), "--out",
                   str(out), "--no-progress") == 0  # fmt: skip
    later = capsys.readouterr().err
    assert "is black" not in later
    assert "the slide is one uniform colour" in later


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_bundle_with_non_finite_weights_is_refused_in_one_line(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: float
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_run.bundle(0), bundle, ignore=shutil.ignore_patterns("checkpoints", "slides"))
    weights = bundle / "model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(weights))
    tensors["classifier.3.weight"][0, :3] = value
    tensors["classifier.3.bias"][1] = value
    save_file(tensors, str(weights), metadata=metadata)
    out = tmp_path / "out"
    code = run_cli(monkeypatch, "predict", "--model", str(bundle), "--slide", str(tiny_run.raw / "slide_0000.png"),
                   "--out", str(out), "--no-progress")  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {weights}: classifier.3.weight holds 3 NaN or infinite value(s) (2 tensors in all), so the model "
        "cannot score a slide; the training diverged or the file is damaged: export the model from a run that "
        "trained normally (e.g. with a lower learning rate)"
    ]
    assert not out.exists()
    assert torch.isfinite(load_file(str(tiny_run.bundle(0) / "model.safetensors"))["classifier.3.bias"]).all()
