"""`gastric-fl prepare` under faults and bad input (issue 10): the user's files survive, errors are one line, exit 2.

Each test names the defect of issue 10 it guards; docs/reliability.md lists them with the reproducing command.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
from support.checks import every
from support.images import file_hashes
from support.seed_slides import config_for, make_seed, read_manifest

from infra.outputs import MARKER_NAME, claim_output, lock_path
from pipeline.errors import PipelineError
from pipeline.images import ImageReadError, decode_raw, probe_size, read_rgb
from pipeline.prepare import prepare_dataset
from pipeline.sources import pixel_sha256
from pipeline.svgmask import rasterise_svg

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    folder = tmp_path / "raw"
    make_seed(folder, n=8)
    return folder


def _main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    """Run ``gastric-fl prepare ARGS`` in this process: (exit code, stderr lines)."""
    from app.cli import main

    monkeypatch.setattr(sys, "argv", ["gastric-fl", "prepare", *args, "--clients", "2", "--sizes", "equal"])
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--tile", "32", "--no-progress"])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# --- defect 1: --overwrite never deletes what prepare did not write ------------------------------------------------


def test_overwrite_refuses_a_dataset_folder_holding_a_foreign_file(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prepared"
    assert _main(monkeypatch, capsys, "--input", str(raw), "--out", str(out))[0] == 0
    assert (out / MARKER_NAME).is_file()
    (out / "thesis").mkdir()
    (out / "thesis" / "ch1.tex").write_text("x")
    (out / "client_00" / "notes.txt").write_text("mine")
    code, lines = _main(monkeypatch, capsys, "--input", str(raw), "--out", str(out), "--overwrite")
    assert code == 2
    assert len(lines) == 1, lines
    assert "gastric-fl prepare did not write" in lines[0]
    assert str(out / "client_00" / "notes.txt") in lines[0]
    assert (out / "thesis" / "ch1.tex").read_text() == "x"
    assert (out / "client_00" / "notes.txt").read_text() == "mine"
    assert (out / "manifest.csv").is_file()


def test_overwrite_refuses_a_folder_without_the_marker_even_with_a_prepare_json(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "v"
    (victim / "thesis").mkdir(parents=True)
    (victim / "thesis" / "ch1.tex").write_text("x")
    (victim / "prepare.json").write_text("{}")
    code, lines = _main(monkeypatch, capsys, "--input", str(raw), "--out", str(victim), "--overwrite")
    assert code == 2
    assert lines == [
        f"error: --out {victim} was not made by gastric-fl prepare (no {MARKER_NAME}); refusing to replace it: "
        "choose another --out, or delete the folder yourself if nothing in it is needed"
    ]
    assert (victim / "thesis" / "ch1.tex").read_text() == "x"
    assert _hidden(tmp_path) == []


def test_overwrite_replaces_its_own_dataset(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out))
    prepare_dataset(config_for(raw, out, split={"clients": 3}, output={"overwrite": True}))
    assert len(json.loads((out / "prepare.json").read_text())["clients"]) == 3
    assert _hidden(tmp_path) == []


# --- defect 2: one writer per --out ---------------------------------------------------------------------------


def test_a_second_prepare_to_the_same_out_is_refused_while_the_first_runs(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prepared"
    with claim_output(out, "prepare"):  # what a running prepare holds
        code, lines = _main(monkeypatch, capsys, "--input", str(raw), "--out", str(out))
    assert code == 2
    assert lines == [
        f"error: --out {out} is being written by gastric-fl prepare (pid {os.getpid()}); wait for it to finish, "
        "stop it, or choose another --out"
    ]
    assert not out.exists()
    assert not lock_path(out).exists()


def test_a_stale_lock_and_partial_folder_of_a_killed_run_are_recovered(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    lock_path(out).write_text(json.dumps({"command": "prepare", "pid": 999999}))  # no flock held: its process died
    stale = tmp_path / ".prepared.partial-dead"
    stale.mkdir()
    (stale / MARKER_NAME).write_text(json.dumps({"command": "prepare", "complete": False}))
    not_ours = tmp_path / ".prepared.partial-unknown"
    not_ours.mkdir()
    (not_ours / "keep.txt").write_text("someone else's")
    prepare_dataset(config_for(raw, out))
    assert (out / "manifest.csv").is_file()
    assert not stale.exists()
    assert (not_ours / "keep.txt").read_text() == "someone else's"  # no marker: never deleted
    assert not lock_path(out).exists()


# --- defect 5: byte-identical slides cannot be in both splits --------------------------------------------------


def test_byte_identical_slides_are_kept_once(raw: Path, tmp_path: Path) -> None:
    for k in range(8):
        shutil.copy(raw / f"s{k:02d}.png", raw / f"t{k:02d}.png")
        shutil.copy(raw / f"s{k:02d}_mask.png", raw / f"t{k:02d}_mask.png")
    before = file_hashes(raw)
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out))
    skipped = {s.source: s.reason for s in result.skipped}
    assert set(skipped) == {f"t{k:02d}.png" for k in range(8)}
    assert "same bytes as s00.png" in skipped["t00.png"]
    digest = {
        row["source"]: hashlib.sha256((raw / row["source"]).read_bytes()).hexdigest() for row in read_manifest(out)
    }
    splits: dict[str, set[str]] = {}
    for row in read_manifest(out):
        splits.setdefault(digest[row["source"]], set()).add(row["split"])
    assert every(len(s) == 1 for s in splits.values())
    assert file_hashes(raw) == before


# The same slide saved again with other bytes (PNG and TIFF, another PNG compression): the same decoded pixels.


def _pixels(path: Path) -> np.ndarray:
    """A slide's pixels as prepare tiles them (RGB uint8)."""
    return np.asarray(read_rgb(path.read_bytes(), path.name))


def _save_png(pixels: np.ndarray, path: Path, level: int) -> None:
    import cv2

    assert cv2.imwrite(str(path), cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, level])


def test_pixel_identical_slides_with_other_bytes_are_kept_once(raw: Path, tmp_path: Path) -> None:
    for k in range(8):
        tifffile.imwrite(raw / f"s{k:02d}.tif", _pixels(raw / f"s{k:02d}.png"), photometric="rgb")  # s{k}_mask.png
    # A re-compressed PNG under another name, with another mask: a slide is its image, whatever its mask says.
    _save_png(_pixels(raw / "s05.png"), raw / "u05.png", level=9)
    shutil.copy(raw / "s00_mask.png", raw / "u05_mask.png")  # all black: u05 would be normal, s05 is abnormal
    for copy, original in (("s00.tif", "s00.png"), ("s07.tif", "s07.png"), ("u05.png", "s05.png")):
        assert (raw / copy).read_bytes() != (raw / original).read_bytes()
        assert np.array_equal(_pixels(raw / copy), _pixels(raw / original))
    before = file_hashes(raw)
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out))

    skipped = {s.source: s.reason for s in result.skipped}
    assert set(skipped) == {f"s{k:02d}.tif" for k in range(8)} | {"u05.png"}
    assert skipped["s03.tif"].startswith("s03.tif: same pixels as s03.png although the files differ")
    assert skipped["u05.png"].startswith("u05.png: same pixels as s05.png")
    assert "remove one of the two files from the input" in skipped["u05.png"]
    rows = read_manifest(out)
    assert {row["source"] for row in rows} <= {f"s{k:02d}.png" for k in range(8)}
    # The copies were tiled before they were recognised: their tiles are gone, nothing else is left.
    tiles = {p.relative_to(out).as_posix() for p in out.glob("client_*/*/*/*.png")}
    assert tiles == {row["path"] for row in rows}
    by_pixels: dict[str, set[str]] = {}
    for row in rows:
        by_pixels.setdefault(pixel_sha256(_pixels(raw / row["source"])), set()).add(row["split"])
    assert len(by_pixels) == len({row["source"] for row in rows})
    assert every(len(splits) == 1 for splits in by_pixels.values())

    info = json.loads((out / "prepare.json").read_text())
    assert {s["source"] for s in info["skipped"]} == set(skipped)
    assert set(info["source_pixels_sha256"]) == {s["source"] for s in info["slides"]}
    assert info["source_pixels_sha256"]["s02.png"] == pixel_sha256(_pixels(raw / "s02.png"))
    assert info["source_sha256"]["s02.png"] == hashlib.sha256((raw / "s02.png").read_bytes()).hexdigest()
    assert next(s for s in info["slides"] if s["source"] == "s05.png")["label"] == "abnormal"
    assert file_hashes(raw) == before

    # Hospitals and splits are those of the input without the copies: the copies took no share of the split.
    make_seed(tmp_path / "clean", n=8)
    prepare_dataset(config_for(tmp_path / "clean", tmp_path / "clean_prepared"))
    clean = json.loads((tmp_path / "clean_prepared" / "prepare.json").read_text())

    def placed(record: dict[str, list[dict[str, object]]]) -> list[tuple[object, ...]]:
        return [(s["source"], s["label"], s["client"], s["split"], s["tiles"]) for s in record["slides"]]

    assert placed(info) == placed(clean)
    assert info["source_pixels_sha256"] == clean["source_pixels_sha256"]


def test_one_changed_pixel_makes_another_slide(raw: Path, tmp_path: Path) -> None:
    pixels = _pixels(raw / "s00.png")
    pixels[50, 60, 1] ^= 1
    tifffile.imwrite(raw / "s00.tif", pixels, photometric="rgb")
    _save_png(pixels, raw / "u00.png", level=9)
    shutil.copy(raw / "s00_mask.png", raw / "u00_mask.png")
    assert int((_pixels(raw / "s00.tif") != _pixels(raw / "s00.png")).sum()) == 1
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out))
    # s00.tif and u00.png hold the same changed picture: one of them is a copy, s00.png is not.
    assert [(s.source, s.reason.split(" (")[0]) for s in result.skipped] == [
        ("u00.png", "u00.png: same pixels as s00.tif although the files differ")
    ]
    info = json.loads((out / "prepare.json").read_text())
    assert {"s00.png", "s00.tif"} <= {s["source"] for s in info["slides"]}
    digests = info["source_pixels_sha256"]
    assert digests["s00.tif"] != digests["s00.png"]
    assert digests["s00.tif"] == pixel_sha256(pixels)


def test_pixel_sha256_covers_shape_and_dtype_not_memory_layout() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    digest = pixel_sha256(pixels)
    assert pixel_sha256(np.asfortranarray(pixels)) == digest
    assert pixel_sha256(np.ascontiguousarray(pixels[::-1])[::-1]) == digest
    assert pixel_sha256(pixels.reshape(6, 4, 3)) != digest
    assert pixel_sha256(pixels.view(np.int8)) != digest
    changed = pixels.copy()
    changed[3, 5, 2] ^= 1
    assert pixel_sha256(changed) != digest


def test_strict_prepare_stops_on_a_pixel_identical_copy_naming_both_files(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tifffile.imwrite(raw / "s03.tif", _pixels(raw / "s03.png"), photometric="rgb")
    assert (raw / "s03.tif").read_bytes() != (raw / "s03.png").read_bytes()
    code, lines = _main(monkeypatch, capsys, "--input", str(raw), "--out", str(tmp_path / "o"), "--strict")
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: s03.tif: same pixels as s03.png although the files differ")
    assert "remove one of the two files from the input" in lines[0]
    assert lines[0].endswith("(stopped by --strict)")
    assert not (tmp_path / "o").exists()
    assert _hidden(tmp_path) == []


# --- defect 6: a vertex far outside the slide does not move the edges inside it --------------------------------


def test_a_far_away_vertex_keeps_the_area_inside_the_slide() -> None:
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="256" height="256" viewBox="0 0 256 256">'
        '<polygon points="10,10 1000000,250 10,250"/></svg>'
    )
    mask = rasterise_svg(svg.encode(), 256, 256, "a.svg").mask
    # Inside the slide the triangle is (almost exactly) the rectangle x 10..256, y 10..250.
    exact = 246 * 240 - 240 * 246**2 / 2 / 999990
    assert abs(int((mask > 0).sum()) - exact) / exact < 0.01
    assert mask[12, 250]
    assert mask[248, 250]


# --- defect 8: an all-black slide is flagged ----------------------------------------------------------------------


def test_an_all_black_slide_is_reported(raw: Path, tmp_path: Path) -> None:
    import cv2

    cv2.imwrite(str(raw / "s00.png"), np.zeros((96, 96, 3), np.uint8))
    result = prepare_dataset(config_for(raw, tmp_path / "prepared"))
    black = [w for w in result.warnings if w.startswith("s00.png")]
    assert len(black) == 1
    assert "black" in black[0]
    assert "s00.png" in (tmp_path / "prepared" / "report.md").read_text()


# --- defect 10: --out that cannot be written -----------------------------------------------------------------------


def test_out_under_a_regular_file_is_one_line(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "ds"
    code, lines = _main(monkeypatch, capsys, "--input", str(raw), "--out", str(out))
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot write --out {out}: ")
    assert "is a file, not a folder" in lines[0]
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize(
    ("code", "hint"),
    [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "read-only"), (errno.EACCES, "permission denied")],
)
def test_a_full_disk_or_read_only_out_is_one_line_and_leaves_nothing(
    raw: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
    hint: str,
) -> None:
    out = tmp_path / "prepared"
    real = Path.write_bytes

    def failing(self: Path, data: bytes) -> int:
        if self.suffix == ".png":
            raise OSError(code, os.strerror(code), str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", failing)
    exit_code, lines = _main(monkeypatch, capsys, "--input", str(raw), "--out", str(out))
    assert exit_code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot write --out {out}: ")
    assert hint in lines[0]
    assert not out.exists()
    assert _hidden(tmp_path) == []


# --- defect 11: image type by content ---------------------------------------------------------------------------


def test_empty_or_text_files_named_png_give_one_line_naming_the_file() -> None:
    cases = (
        (b"", "empty file (0 bytes); re-export it or remove it from the input"),
        (b"hello, world\n", "not a PNG, JPEG or TIFF image (it holds text); re-export it or remove it from the input"),
        (b"%PDF-1.7\x00\x01", "not a PNG, JPEG or TIFF image (its first bytes are 25 50 44 46); re-export it"),
    )
    for data, what in cases:
        for reader in (probe_size, decode_raw):
            with pytest.raises(ImageReadError) as info:
                reader(data, "slides/s00.png")
            message = str(info.value)
            assert message.startswith(f"slides/s00.png: {what}")
            assert "BytesIO" not in message
            assert "b'" not in message  # never a Python bytes literal
            assert "\n" not in message
            assert str(pickle.loads(pickle.dumps(info.value))) == message  # intact through a process pool


def test_png_and_tiff_are_recognised_by_content_whatever_the_name(tmp_path: Path) -> None:
    import cv2

    pixels = np.random.default_rng(0).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    ok, png = cv2.imencode(".png", pixels)
    assert ok
    tiff_path = tmp_path / "a.tiff"
    tifffile.imwrite(tiff_path, pixels, photometric="rgb")
    tiff = tiff_path.read_bytes()
    for data in (png.tobytes(), tiff):
        for name in ("x.png", "x.tiff", "x.tif"):
            assert probe_size(data, name) == (30, 20)
            assert decode_raw(data, name).shape == (20, 30, 3)


def test_strict_prepare_names_an_empty_slide_in_one_line(
    raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (raw / "s03.png").write_bytes(b"")
    code, lines = _main(monkeypatch, capsys, "--input", str(raw), "--out", str(tmp_path / "o"), "--strict")
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: s03.png: empty file (0 bytes)")
    assert not (tmp_path / "o").exists()


# --- defect 15: SIGTERM while tiling leaves nothing behind -----------------------------------------------------


def _sigterm_once_written(script: str, folder: Path, pattern: str) -> str:
    """Run ``script`` in a new interpreter, SIGTERM it once ``folder`` holds a file matching ``pattern``, and
    return its stderr after checking that it exited with 128 + SIGTERM."""
    process = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not list(folder.glob(pattern)):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    return stderr


def test_sigterm_while_tiling_removes_the_partial_folder(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    script = (
        "import sys, time\n"
        "import pipeline.prepare_tiling as p\n"
        "real = p.encode_png\n"
        "def slow(tile):\n"
        "    time.sleep(0.05)\n"
        "    return real(tile)\n"
        "p.encode_png = slow\n"
        "from app.cli import main\n"
        f"sys.argv = ['gastric-fl', 'prepare', '--input', {str(raw)!r}, '--out', {str(out)!r}, '--clients', '2',"
        " '--sizes', 'equal', '--tile', '32', '--no-progress']\n"
        "main()\n"
    )
    stderr = _sigterm_once_written(script, tmp_path, ".prepared.partial-*/client_00/*/*/*.png")
    assert stderr.strip().splitlines()[-1] == (
        f"error: prepare stopped by SIGTERM; nothing was written to {out} (run it again)"
    )
    assert not out.exists()
    assert _hidden(tmp_path) == []


# --- the same classes of fault in `synth`: one writer per --out, SIGTERM cleans up ---------------------------------


def test_a_second_synth_to_the_same_out_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    out = tmp_path / "raw"
    monkeypatch.setattr(sys, "argv", ["gastric-fl", "synth", "--images", "2", "--size", "128", "--out", str(out)])
    with claim_output(out, "synth"), pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --out {out} is being written by gastric-fl synth (pid {os.getpid()}); wait for it to finish, "
        "stop it, or choose another --out"
    ]
    assert not out.exists()


def test_sigterm_during_synth_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "raw"
    script = (
        "import sys\n"
        "from app.cli import main\n"
        f"sys.argv = ['gastric-fl', 'synth', '--images', '400', '--size', '128', '--out', {str(out)!r}]\n"
        "main()\n"
    )
    stderr = _sigterm_once_written(script, tmp_path, ".raw.partial-*/*.png")
    assert (
        stderr.strip().splitlines()[-1]
        == f"error: synth stopped by SIGTERM; nothing was written to {out} (run it again)"
    )
    assert not out.exists()
    assert _hidden(tmp_path) == []


def test_a_dataset_parked_aside_by_a_killed_replacement_is_put_back(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out))
    before = file_hashes(out)
    out.rename(tmp_path / ".prepared.old-killed")  # kill -9 between moving the old dataset aside and the new in
    with pytest.raises(PipelineError, match="already exists"):
        prepare_dataset(config_for(raw, out))
    assert file_hashes(out) == before
    assert _hidden(tmp_path) == []


def test_out_that_is_a_file_is_named_as_such(raw: Path, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(PipelineError, match=r"--out .*f is not a folder; choose another --out"):
        prepare_dataset(config_for(raw, tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "x"
