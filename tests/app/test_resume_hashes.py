"""`gastric-fl train --resume` reads nothing of the server's without its hash, and names what is gone (issue 48,
part 3), played from the failing disk's and the careless operator's side: one byte flipped in a server checkpoint,
every checkpoint removed, the newest removed, and a checkpoint of an earlier version (no hash recorded)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.cli import run_cli
from support.tiny_dataset import TINY_SETTINGS

SETTINGS = [arg for setting in (*TINY_SETTINGS, "run.keep_checkpoints=2") for arg in ("--set", setting)]


@pytest.fixture(scope="module")
def finished(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-round FedAvg run keeping both checkpoints, never modified: tests copy it."""
    run = tmp_path_factory.mktemp("runs") / "finished"
    with pytest.MonkeyPatch.context() as patch:
        assert run_cli(patch, "train", "--data", str(dataset), "--out", str(run), "-q", *SETTINGS) == 0
    return run


def _resume(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], damage: str
) -> tuple[Path, int, str, bytes]:
    run = tmp_path / "R"
    shutil.copytree(finished, run, symlinks=True)
    checkpoints = run / "checkpoints"
    if damage == "flip":
        path = checkpoints / "round_0002.safetensors"
        data = path.read_bytes()
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    elif damage == "remove all":
        for path in checkpoints.iterdir():
            path.unlink()
    elif damage == "remove newest":
        (checkpoints / "round_0002.json").unlink()
        (checkpoints / "round_0002.safetensors").unlink()
    elif damage == "no hash":
        sidecar = checkpoints / "round_0002.json"
        sidecar.write_text(json.dumps({k: v for k, v in json.loads(sidecar.read_text()).items() if k != "sha256"}))
    summary = (run / "summary.json").read_bytes()
    capsys.readouterr()
    code = run_cli(monkeypatch, "train", "--resume", str(run), "-q", "--set", "run.rounds=3")
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return run, code, err, summary


def _error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith(("run directory:", "warning:"))]
    assert len(lines) == 1, err
    return lines[0]


def test_every_server_checkpoint_carries_the_sha256_of_its_file(finished: Path) -> None:
    import hashlib

    for r in (1, 2):
        sidecar = json.loads((finished / "checkpoints" / f"round_{r:04d}.json").read_text())
        data = (finished / "checkpoints" / f"round_{r:04d}.safetensors").read_bytes()
        assert sidecar["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_flipped_byte_in_a_server_checkpoint_stops_the_resume_in_one_line(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, code, err, summary = _resume(finished, tmp_path, monkeypatch, capsys, "flip")
    assert code == 2
    path = run / "checkpoints" / "round_0002.safetensors"
    line = _error(err)
    assert line.startswith(
        f"error: checkpoint {path} does not hash to the sha256 round_0002.json recorded when it was written ("
    )
    assert line.endswith(
        "it changed since, so the run cannot continue from it; restore it from a backup, or remove it and "
        "round_0002.json to continue from the round before"
    )
    # before: loaded silently. Now nothing was run: the run stays finished, its checkpoint stays for inspection
    assert (run / "summary.json").read_bytes() == summary
    assert path.is_file()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 6


def test_removed_server_checkpoints_are_named_not_restarted_from_round_1(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, code, err, summary = _resume(finished, tmp_path, monkeypatch, capsys, "remove all")
    assert code == 2
    assert _error(err) == (
        f"error: {run / 'checkpoints'} holds no complete checkpoint, but {run / 'summary.json'} records 2 round(s) "
        "done: the checkpoints were removed (round_0001, round_0002); restore them, or start afresh with gastric-fl "
        f"train --config {run / 'config.toml'} --out NEW_RUN"
    )
    assert (run / "summary.json").read_bytes() == summary  # before: a silent restart from round 1
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 6


def test_a_removed_newest_server_checkpoint_is_named_and_its_round_run_again(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, code, err, _ = _resume(finished, tmp_path, monkeypatch, capsys, "remove newest")
    assert code == 0, err
    assert (
        f"warning: {run / 'checkpoints'}: the checkpoints of the last 1 round(s) done (round_0002) were removed; "
        "resuming after round 1, those rounds are run again"
    ) in err.splitlines()
    rounds = [json.loads(line)["round"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_a_checkpoint_of_an_earlier_version_is_loaded_unchecked_and_says_so(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, code, err, _ = _resume(finished, tmp_path, monkeypatch, capsys, "no hash")
    assert code == 0, err
    path = run / "checkpoints" / "round_0002.safetensors"
    assert (
        f"warning: checkpoint {path} was written without its sha256 (an earlier version): loaded unchecked"
        in err.splitlines()
    )
    assert json.loads((run / "summary.json").read_text())["rounds_done"] == 3
