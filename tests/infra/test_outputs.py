"""infra.outputs: the ownership marker, the one-writer lock and path confinement that commands share (issue 10)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.outputs import (
    MARKER_NAME,
    OutputError,
    PathOutsideError,
    check_replaceable,
    claim_output,
    confine,
    foreign_entries,
    lock_path,
    os_error_message,
    write_marker,
)

ROOT = Path(__file__).resolve().parents[2]


def _made_by(folder: Path, command: str) -> Path:
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / "sub" / "b.txt").write_text("b")
    (folder / "empty").mkdir()
    write_marker(folder, command)
    return folder


def test_missing_empty_and_own_folders_are_replaceable(tmp_path: Path) -> None:
    check_replaceable(tmp_path / "missing", "prepare")
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty", "prepare")
    check_replaceable(_made_by(tmp_path / "ours", "prepare"), "prepare")


def test_foreign_files_unmarked_folders_and_other_commands_are_refused(tmp_path: Path) -> None:
    ours = _made_by(tmp_path / "ours", "prepare")
    (ours / "sub" / "thesis.tex").write_text("x")
    with pytest.raises(OutputError, match=r"holds .*sub/thesis\.tex, which gastric-fl prepare did not write \(1 such"):
        check_replaceable(ours, "prepare")
    (ours / "sub" / "thesis.tex").unlink()
    (ours / "mine").mkdir()  # an empty folder nobody listed is someone's
    assert foreign_entries(ours, "prepare") == ["mine/"]
    with pytest.raises(OutputError, match="was not made by gastric-fl train"):
        check_replaceable(ours, "train")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.toml").write_text("[tool]")
    with pytest.raises(OutputError, match=f"no {MARKER_NAME}"):
        check_replaceable(bare, "train")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is not a folder"):
        check_replaceable(tmp_path / "file", "prepare")


def test_patterns_accept_what_a_growing_output_adds(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    write_marker(run, "train", record_contents=False)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "round_0001.safetensors").write_bytes(b"")
    (run / "metrics.jsonl").write_text("")
    patterns = ("metrics.jsonl", "checkpoints/", "checkpoints/*.safetensors")
    check_replaceable(run, "train", patterns=patterns)
    (run / "checkpoints" / "notes.txt").write_text("x")
    with pytest.raises(OutputError, match=r"checkpoints/notes\.txt"):
        check_replaceable(run, "train", patterns=patterns, flag="--run")


def test_a_second_claim_is_refused_naming_the_pid_and_the_lock_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "new" / "out"
    with claim_output(out, "prepare") as lock:
        assert lock == lock_path(out)
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(OutputError) as info, claim_output(out, "train"):
            pass
        assert str(info.value) == (
            f"--out {out} is being written by gastric-fl prepare (pid {os.getpid()}); wait for it to finish, "
            "stop it, or choose another --out"
        )
    assert not lock_path(out).exists()
    assert not (tmp_path / "new").exists()  # the parent it made is removed again when left empty


def test_a_lock_held_by_another_process_is_refused_and_freed_when_it_dies(tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from infra.outputs import claim_output\n"
        f"with claim_output(Path({str(out)!r}), 'prepare'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(OutputError, match=rf"gastric-fl prepare \(pid {holder.pid}\)"),
            claim_output(out, "prepare"),
        ):
            pass
    finally:
        holder.kill()  # like kill -9: no cleanup, the lock file stays
        holder.wait()
    assert lock_path(out).exists()
    deadline = time.monotonic() + 5
    with claim_output(out, "prepare"):
        assert time.monotonic() < deadline


def test_confine_refuses_paths_leaving_the_folder(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    (root / "client_00").mkdir(parents=True)
    (tmp_path / "secret.png").write_bytes(b"x")
    assert confine(root, "client_00/a.png") == root / "client_00" / "a.png"
    for bad, why in (
        ("../secret.png", "goes up"),
        ("client_00/../../secret.png", "goes up"),
        ("/etc/passwd", "absolute path"),
        ("C:\\x.png", "absolute path"),
        ("", "empty path"),
    ):
        with pytest.raises(PathOutsideError, match=why):
            confine(root, bad)
    (root / "client_01").symlink_to(tmp_path)
    with pytest.raises(PathOutsideError, match="through a link"):
        confine(root, "client_01/secret.png")


def test_os_errors_become_one_actionable_line(tmp_path: Path) -> None:
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "o" / "x.png"))
    assert os_error_message(full, tmp_path / "o") == (
        f"cannot write --out {tmp_path / 'o'}: {tmp_path / 'o' / 'x.png'}: No space left on device; "
        "the disk is full: free some space or choose another --out"
    )
