"""progress.json: the round loop reports each phase of a round and each hospital as it answers; the reader is
torch-free and shrugs off a damaged file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.tiny_dataset import TINY_SETTINGS, make_dataset

from federation.config import load_config
from federation.launch import train
from federation.progress import PROGRESS_FILE, RoundProgress, read_progress, write_progress
from federation.server import summary


def test_progress_round_trips_and_a_damaged_file_reads_as_none(tmp_path: Path) -> None:
    written = RoundProgress(3, 5, "training", 2, 4, 1700000000.5)
    write_progress(tmp_path, written)
    assert read_progress(tmp_path) == written
    assert [p.name for p in tmp_path.iterdir()] == [PROGRESS_FILE]  # the temp file was renamed, not left
    (tmp_path / PROGRESS_FILE).write_text('{"round": 3, "phase": "trai')
    assert read_progress(tmp_path) is None
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({**written.__dict__, "phase": "sleeping"}))
    assert read_progress(tmp_path) is None
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({**written.__dict__, "hospitals_done": 9}))
    read = read_progress(tmp_path)
    assert read is not None
    assert read.hospitals_done == 4  # never more than asked
    assert read_progress(tmp_path / "missing") is None


def test_write_progress_never_raises(tmp_path: Path) -> None:
    missing = tmp_path / "no such folder"
    write_progress(missing, RoundProgress(1, 1, "training", 0, 3, 0.0))  # skipped, no error
    assert not missing.exists()  # nothing made either: progress never creates a run directory
    assert read_progress(missing) is None


def test_reading_progress_does_not_import_torch() -> None:
    code = "import sys, federation.progress; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "False"


def test_the_round_loop_reports_phases_and_each_hospital(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = make_dataset(tmp_path / "tiny")
    seen: list[tuple[int, str, int, int]] = []
    real = summary.write_progress

    def record(run_dir: Path, progress: RoundProgress) -> None:
        seen.append((progress.round, progress.phase, progress.hospitals_done, progress.hospitals_total))
        assert progress.rounds_total == 2
        real(run_dir, progress)

    monkeypatch.setattr(summary, "write_progress", record)
    config = load_config(None, [*TINY_SETTINGS, "run.rounds=2", "strategy.name=fedavg"], data=dataset)
    run_dir = tmp_path / "run"
    train(config, run_dir, progress=False)
    training = [("training", 0, 3), ("training", 1, 3), ("training", 2, 3), ("training", 3, 3), ("aggregating", 0, 3)]
    evaluating = [("evaluating", 0, 3), ("evaluating", 1, 3), ("evaluating", 2, 3), ("evaluating", 3, 3)]
    # FedAvg's evaluation of round 1 comes with round 2's training; round 2's is asked for after the last round
    assert seen == [(r, *step) for r in (1, 2) for step in training] + [(2, *step) for step in evaluating]
    assert read_progress(run_dir) == RoundProgress(2, 2, "evaluating", 3, 3, read_progress(run_dir).updated_at)  # type: ignore[union-attr]
