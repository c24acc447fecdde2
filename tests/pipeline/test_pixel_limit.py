"""The pixel limit (item 7 of issue 23, "bounded inputs"): an image whose header declares more pixels than
``--max-pixels`` is refused from its header alone, in one line naming the file, its size and the limit, before any
pixel is decoded; prepare skips such a slide like any bad slide (or stops with ``--strict``)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.images import bomb_png, bomb_tiff
from support.seed_slides import config_for, make_seed

from pipeline import images
from pipeline.errors import PipelineError
from pipeline.images import (
    DEFAULT_MAX_PIXELS,
    LIMIT_CEILING,
    ImageReadError,
    ImageTooLargeError,
    check_max_pixels,
    check_pixels,
    header_size,
    probe_size,
    read_mask,
    read_rgb,
)
from pipeline.prepare import prepare_dataset
from pipeline.synth import MAX_SIZE

ROOT = Path(__file__).resolve().parents[2]
BOMBS = {"bomb.png": bomb_png, "bomb.tif": bomb_tiff}
# prepare imports no torch, so 3 GiB of address space is plenty for it, and far below the 10 GiB a 60000 x 60000 RGB
# image needs: a decoder that tried would fail with a MemoryError instead of the refusal.
PREPARE_ADDRESS_SPACE = 3 * 2**30


def _limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_the_bomb_files_are_tiny_and_declare_60000_squared() -> None:
    for name, make in BOMBS.items():
        data = make(60000, 60000)
        assert len(data) < 200, name
        assert header_size(data, name) == (60000, 60000)


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_every_reader_refuses_a_bomb_from_its_header(name: str) -> None:
    data = BOMBS[name](60000, 60000)
    expected = (
        f"{name}: 60000x60000 is 3,600,000,000 pixels, more than the limit of 67,108,864 pixels; "
        "downscale it or raise --max-pixels"
    )
    for read in (read_rgb, read_mask, probe_size, check_pixels):
        with pytest.raises(ImageTooLargeError) as info:
            read(data, name)
        assert str(info.value) == expected, read.__name__
    assert isinstance(info.value, PipelineError)
    assert info.value.user_facing


def test_the_limit_is_inclusive_and_can_be_raised_or_lowered() -> None:
    data = bomb_png(300, 200)
    assert check_pixels(data, "s.png", 60000) == (300, 200)
    with pytest.raises(ImageTooLargeError, match=r"s\.png: 300x200 is 60,000 pixels, more than the limit of 59,999"):
        check_pixels(data, "s.png", 59999)
    big = bomb_png(9000, 8000)  # 72 Mpx: over the default, under a raised limit
    with pytest.raises(ImageTooLargeError):
        check_pixels(big, "big.png")
    assert check_pixels(big, "big.png", 80_000_000) == (9000, 8000)


def test_the_default_accepts_the_largest_slide_synth_writes() -> None:
    assert DEFAULT_MAX_PIXELS == MAX_SIZE * MAX_SIZE == 67_108_864
    assert check_pixels(bomb_tiff(MAX_SIZE, MAX_SIZE), "synth.tif") == (MAX_SIZE, MAX_SIZE)
    with pytest.raises(ImageTooLargeError):
        check_pixels(bomb_tiff(MAX_SIZE + 1, MAX_SIZE), "synth.tif")


@pytest.mark.parametrize("value", [0, -5, LIMIT_CEILING + 1, True, 1.5])
def test_a_limit_outside_what_opencv_decodes_is_refused(value: object) -> None:
    with pytest.raises(PipelineError, match=r"^--max-pixels .* must be a whole number of pixels from 1 to 1073741824"):
        check_max_pixels(value)  # type: ignore[arg-type]
    assert check_max_pixels(LIMIT_CEILING) == LIMIT_CEILING


def test_pils_own_bomb_check_never_fires_and_never_warns() -> None:
    """PIL warns above 89.5 Mpx and raises above 179 Mpx on its own; headers are read past that check, so under a
    raised limit such a PNG is judged by ``--max-pixels`` alone (and checked as prepare checks any PNG)."""
    for width, height in ((10000, 9000), (20000, 10000)):
        data = bomb_png(width, height)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert header_size(data, "wide.png") == (width, height)
            assert probe_size(data, "wide.png", LIMIT_CEILING) == (width, height)


def test_opencvs_assertion_text_never_reaches_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise cv2.error(
            "OpenCV(5.0.0) /io/opencv/modules/imgcodecs/src/loadsave.cpp:79: error: (-215:Assertion failed) "
            "pixels <= CV_IO_MAX_IMAGE_PIXELS in function 'validateInputImageSize'\n"
        )

    monkeypatch.setattr(images.cv2, "imdecode", refuse)
    data = cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes()
    with pytest.raises(ImageReadError) as info:
        read_rgb(data, "scan.png")
    assert str(info.value) == (
        "scan.png: cannot decode image (OpenCV's decoder refused the data); re-export it or remove it from the input"
    )


def _with_bombs(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    make_seed(raw, n=8)
    for name, make in BOMBS.items():
        (raw / name).write_bytes(make(60000, 60000))
    return raw


def test_prepare_skips_and_reports_a_bomb_like_any_bad_slide(tmp_path: Path) -> None:
    raw = _with_bombs(tmp_path)
    before = {p.name: p.read_bytes() for p in raw.iterdir()}
    result = prepare_dataset(config_for(raw, tmp_path / "out"))
    skipped = {s.source: s.reason for s in result.skipped}
    assert set(skipped) == set(BOMBS)
    for name in BOMBS:
        assert skipped[name] == (
            f"{name}: 60000x60000 is 3,600,000,000 pixels, more than the limit of 67,108,864 pixels; "
            "downscale it or raise --max-pixels"
        )
    assert result.slides == 8
    record = json.loads((tmp_path / "out" / "prepare.json").read_text())
    assert record["config"]["source"]["max_pixels"] == DEFAULT_MAX_PIXELS
    assert "60000x60000" in (tmp_path / "out" / "report.md").read_text()
    assert {p.name: p.read_bytes() for p in raw.iterdir()} == before  # raw data is never modified


def test_prepare_max_pixels_lowers_the_limit(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_seed(raw, n=4)  # 96 x 96 slides: 9216 pixels
    with pytest.raises(PipelineError, match=r"none of the 4 slide\(s\) .* is usable; first problem: s00\.png: 96x96"):
        prepare_dataset(config_for(raw, tmp_path / "out", source={"max_pixels": 9215}))
    assert not (tmp_path / "out").exists()
    prepare_dataset(config_for(raw, tmp_path / "out", source={"max_pixels": 9216}))


def test_prepare_strict_stops_at_a_bomb_in_one_line_under_a_memory_limit(tmp_path: Path) -> None:
    raw = _with_bombs(tmp_path)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "app.cli", "prepare", "--input", str(raw), "--out", str(out), "--clients", "2",
               "--sizes", "equal", "--tile", "32", "--strict", "--no-progress"]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        preexec_fn=lambda: _limit_memory(PREPARE_ADDRESS_SPACE),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "error: bomb.png: 60000x60000 is 3,600,000,000 pixels, more than the limit of 67,108,864 pixels; downscale "
        "it or raise --max-pixels (stopped by --strict; 2 bad slide(s) in total)"
    ]
    assert not out.exists()


def test_prepare_cli_max_pixels_option_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    raw = tmp_path / "raw"
    make_seed(raw, n=4)
    argv = ["gastric-fl", "prepare", "--input", str(raw), "--out", str(tmp_path / "out"), "--max-pixels", "0"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --max-pixels 0 must be a whole number of pixels from 1 to 1073741824 (2**30, the most OpenCV "
        "decodes); the default is 67108864 (8192 x 8192)"
    ]
    assert not (tmp_path / "out").exists()
