"""`gastric-fl train` under faults and bad input (issue 10): user files survive, one line, exit code 2.

Each test runs the command as a user does (``app.cli.main``) on the tiny three-hospital dataset, one or two rounds.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import safetensors.torch
from support.cli import run_cli
from support.tiny_dataset import TINY_SETTINGS, make_dataset

from infra.outputs import MARKER_NAME, claim_output

TINY = [arg for setting in TINY_SETTINGS for arg in ("--set", setting)]
ONE_ROUND = [*TINY, "--set", "run.rounds=1"]


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The command's stderr without the ``run directory:`` notice and ``warning:`` lines: exactly one ``error:``."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if not line.startswith(("run directory:", "warning:")) and line]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def finished(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-round FedAvg run (keep_checkpoints = 2), never modified: tests copy it."""
    run_dir = tmp_path_factory.mktemp("runs") / "finished"
    with pytest.MonkeyPatch.context() as patch:
        assert run_cli(patch, "train", "--data", str(dataset), "--out", str(run_dir), "-q", *TINY) == 0
    return run_dir


def _copy_run(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target, symlinks=True)
    return target


def _summary(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "summary.json").read_text())


def _records(path: Path) -> list[dict[str, object]]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in path.read_text().splitlines()]


# -- defect 1: --overwrite never deletes what train did not write; one writer per run directory ----------------------
def test_overwrite_refuses_a_folder_train_did_not_make(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    v = tmp_path / "v"
    (v / "thesis").mkdir(parents=True)
    (v / "thesis" / "ch1.tex").write_text("x")
    (v / "config.toml").write_text("[tool]\n")
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(v), "--overwrite", "-q", *ONE_ROUND) == 2
    line = _error_line(capsys)
    assert line == (
        f"error: --out {v} was not made by gastric-fl train (no {MARKER_NAME}); refusing to replace it: "
        "choose another --out, or delete the folder yourself if nothing in it is needed"
    )
    assert (v / "thesis" / "ch1.tex").read_text() == "x"
    assert (v / "config.toml").read_text() == "[tool]\n"
    # without --overwrite, the refusal no longer suggests --overwrite for a folder that is not a run
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(v), "-q", *ONE_ROUND) == 2
    line = _error_line(capsys)
    assert "--overwrite" not in line
    assert str(v) in line
    assert (v / "thesis" / "ch1.tex").read_text() == "x"


def test_overwrite_refuses_a_run_holding_a_foreign_file_and_replaces_a_clean_one(
    finished: Path, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(finished, tmp_path / "run")
    assert (run_dir / MARKER_NAME).is_file()
    assert run_cli(monkeypatch, "report", str(run_dir)) == 0  # report's files belong to the run
    capsys.readouterr()
    (run_dir / "hospitals" / "client_01" / "notes.txt").write_text("mine")
    args = ["train", "--data", str(dataset), "--out", str(run_dir), "--overwrite", "-q", *ONE_ROUND]
    assert run_cli(monkeypatch, *args) == 2
    assert _error_line(capsys) == (
        f"error: --out {run_dir} holds {run_dir / 'hospitals/client_01/notes.txt'}, which gastric-fl train did not "
        "write (1 such entry); refusing to replace it: move them out or choose another --out"
    )
    assert (run_dir / "hospitals" / "client_01" / "notes.txt").read_text() == "mine"
    assert _summary(run_dir)["rounds_done"] == 2
    (run_dir / "hospitals" / "client_01" / "notes.txt").unlink()
    assert run_cli(monkeypatch, *args) == 0
    assert _summary(run_dir)["rounds_done"] == 1
    assert not (run_dir / "report.md").exists()


def test_a_second_train_into_the_same_run_directory_is_refused(
    finished: Path, dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(finished, tmp_path / "run")
    before = (run_dir / "metrics.jsonl").read_text()
    with claim_output(run_dir, "train"):  # another writer holds the run directory
        assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run_dir), "--overwrite", *TINY) == 2
        line = _error_line(capsys)
        assert line.startswith(f"error: --out {run_dir} is being written by gastric-fl train (pid ")
        assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "-q") == 2
        assert _error_line(capsys).startswith(f"error: --resume {run_dir} is being written by gastric-fl train")
    assert (run_dir / "metrics.jsonl").read_text() == before
    assert _summary(run_dir)["status"] == "finished"


# -- defect 3: the dataset's manifest hash is recorded; resume on another dataset is refused -------------------------
def test_resume_on_a_changed_dataset_is_refused_and_the_run_stays_finished(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_dataset(tmp_path / "data")
    run_dir = tmp_path / "run"
    assert run_cli(monkeypatch, "train", "--data", str(data), "--out", str(run_dir), "-q", *ONE_ROUND) == 0
    capsys.readouterr()
    recorded = _summary(run_dir)["dataset_sha256"]
    assert isinstance(recorded, str)
    assert len(recorded) == 64
    manifest = data / "manifest.csv"
    lines = manifest.read_text().splitlines()
    lines[1] = lines[1].replace(",train,", ",test,", 1)  # re-prepared: one training tile is now a test tile
    manifest.write_text("\n".join(lines) + "\n")
    before = (run_dir / "summary.json").read_text()
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "--set", "run.rounds=2", "-q") == 2
    line = _error_line(capsys)
    assert str(manifest) in line
    assert "changed since run" in line
    assert f"--config {run_dir / 'config.toml'} --out NEW_RUN" in line
    assert (run_dir / "summary.json").read_text() == before  # not re-marked failed


# -- defect 9: a diverging FedAvg ends with one clear line ----------------------------------------------------------
def test_fedavg_with_a_huge_learning_rate_ends_with_one_line(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "diverged"
    args = ["train", "--data", str(dataset), "--out", str(run_dir), "-q", *TINY]
    assert run_cli(monkeypatch, *args, "--set", "strategy.name=fedavg", "--set", "client.lr=1e6") == 2
    line = _error_line(capsys)
    # the hospitals refuse to keep or deploy the non-finite model, so no round completes: round 1 says why
    assert line.startswith("error: round 1: no hospital could evaluate")
    assert "the training diverged (client.lr is 1000000.0)" in line
    assert "not kept or deployed" in line
    assert f"--config {run_dir / 'config.toml'}" in line
    assert _summary(run_dir)["status"] == "failed"


# -- defect 10: write faults are one line ----------------------------------------------------------------------------
def test_out_under_a_regular_file_is_one_line(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("a file")
    out = tmp_path / "f" / "run"
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(out), "-q", *ONE_ROUND) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: cannot write --out {out}: ")
    assert line.endswith("a part of the path is a file, not a folder: choose another --out")
    assert (tmp_path / "f").read_text() == "a file"


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (errno.ENOSPC, "the disk is full: free some space or choose another --out"),
        (errno.EROFS, "the file system is read-only: choose a writable --out"),
    ],
)
def test_a_full_disk_or_read_only_out_is_one_line(
    code: int,
    hint: str,
    dataset: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the tests run as root, where permissions do not bite: the fault is injected into the checkpoint writer
    def full(tensors: object, filename: str, *args: object, **kwargs: object) -> None:
        raise OSError(code, "injected", filename)

    monkeypatch.setattr(safetensors.torch, "save_file", full)  # federation.runs imports it where it writes
    run_dir = tmp_path / "run"
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run_dir), "-q", *ONE_ROUND) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: cannot write --out {run_dir}: {run_dir / 'checkpoints'}")
    assert line.endswith(hint)
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp file left


# -- defect 12: a configuration error found after the run directory exists can be fixed -----------------------------
def test_a_bad_nhead_is_refused_before_the_run_directory_exists(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "--data", str(dataset), "--out", str(run_dir), "-q", *ONE_ROUND, "--set", "strategy.name=fedrep"]
    assert run_cli(monkeypatch, *args, "--set", "strategy.nhead=99") == 2
    assert "nhead=99 is out of range" in _error_line(capsys)
    assert not run_dir.exists()
    assert run_cli(monkeypatch, *args, "--set", "strategy.nhead=2") == 0


def test_a_run_that_failed_before_its_first_checkpoint_resumes_with_a_corrected_setting(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # FedAMP's alpha_k * (m - 1) <= sigma depends on how many hospitals answer: found in round 1, inside the run
    run_dir = tmp_path / "run"
    bad = ["--set", "strategy.name=fedamp", "--set", "amp.alpha_k=5", "--set", "amp.sigma=1"]
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run_dir), "-q", *ONE_ROUND, *bad) == 2
    line = _error_line(capsys)
    assert "amp.alpha_k" in line
    assert f"gastric-fl train --resume {run_dir} --set" in line
    assert _summary(run_dir)["status"] == "failed"
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "-q", "--set", "amp.alpha_k=0.2") == 0
    assert _summary(run_dir)["status"] == "finished"
    assert "alpha_k = 0.2" in (run_dir / "config.toml").read_text()


# -- defect 13: a stale "running" status whose pid is another process does not block ---------------------------------
def test_a_stale_running_status_with_a_reused_pid_does_not_block(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(finished, tmp_path / "run")
    summary = _summary(run_dir)
    summary.update(status="running", pid=1, pid_started=1)  # pid 1 lives, but it is not the process that wrote this
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "-q") == 0
    assert "still running" not in capsys.readouterr().err
    assert _summary(run_dir)["status"] == "finished"


# -- defect 14: a corrupt latest checkpoint; a refused resume does not re-mark a finished run -------------------------
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(finished, tmp_path / "run")
    latest = run_dir / "checkpoints" / "round_0002.safetensors"
    latest.write_bytes(b"\x00" * 10)
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "-q") == 0
    err = capsys.readouterr().err
    assert f"warning: checkpoint {latest} cannot be read" in err
    assert "resuming after round 1" in err
    assert _summary(run_dir)["status"] == "finished"
    assert _records(run_dir / "metrics.jsonl") == _records(finished / "metrics.jsonl")  # round 2 redone, same numbers


# -- defect 15: temp files of a write killed by kill -9 are cleaned at the next start --------------------------------
def test_temp_files_left_by_a_killed_checkpoint_write_are_removed(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(finished, tmp_path / "run")
    left = [
        run_dir / "checkpoints" / ".round_0003.safetensors.k9x1y2",
        run_dir / ".summary.json.abc123",
        run_dir / "hospitals" / "client_00" / "checkpoints" / ".round_0003.safetensors.4242",
        run_dir / "hospitals" / "client_02" / ".model.safetensors.4242",
    ]
    for path in left:
        path.write_bytes(b"")
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "--set", "run.rounds=3", "-q") == 0
    assert [p for p in left if p.exists()] == []
    assert _summary(run_dir)["rounds_done"] == 3


# -- damaged run files are named on resume, and the damaged round is redone --------------------------------------------
def test_a_damaged_metrics_line_is_named_and_restored_on_resume(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy_run(finished, tmp_path / "run")
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[:-40])  # the last line cut in half
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "-q") == 0
    err = capsys.readouterr().err
    assert f"warning: {metrics}, line 6: cut off (not valid JSON)" in err
    assert _records(metrics) == _records(finished / "metrics.jsonl")
