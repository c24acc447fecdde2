"""`gastric-fl prepare` under faults and bad input (issue 10): the user's files survive, errors are one line, exit 2.

Each test names the defect of issue 10 it guards; docs/reliability.md lists them with the reproducing command.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
from test_prepare import config_for, file_hashes, make_seed, read_manifest

from pipeline.errors import PipelineError
from pipeline.images import ImageReadError, decode_raw, probe_size
from pipeline.outputs import MARKER_NAME, claim_output, lock_path
from pipeline.prepare import prepare_dataset
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
    assert all(len(s) == 1 for s in splits.values())
    assert file_hashes(raw) == before


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
    for data, what in ((b"", "empty file"), (b"hello, world\n", "not a PNG, JPEG or TIFF image")):
        for reader in (probe_size, decode_raw):
            with pytest.raises(ImageReadError) as info:
                reader(data, "slides/s00.png")
            message = str(info.value)
            assert message.startswith("slides/s00.png: ")
            assert what in message
            assert "BytesIO" not in message
            assert "\n" not in message


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
        "import pipeline.prepare as p\n"
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
