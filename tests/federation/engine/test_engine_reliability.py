"""The run directory's lifecycle under faults (issue 10): markers, stale pids, temp files, damaged run files, jobs."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.tiny_dataset import TINY_SETTINGS, make_dataset

from app.dashboard import jobs
from federation.config import RunConfig, config_to_toml, load_config
from federation.engine import load_run_config
from federation.errors import FederationError
from federation.hospital.handler import Hospital, Site
from federation.launch import train
from federation.runs import (
    RUN_PATTERNS,
    clean_temp_files,
    complete_checkpoints,
    is_live_run,
    keep_rounds,
)
from federation.server.resume import open_for_resume
from federation.wire.contract import Failure, Hello
from infra import pids
from infra.outputs import MARKER_NAME, foreign_entries


def _config(dataset: Path, *extra: str) -> RunConfig:
    return load_config(None, [*TINY_SETTINGS, "run.rounds=1", *extra], data=dataset)


def test_a_run_directory_carries_trains_marker_and_holds_only_what_a_run_writes(dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(_config(dataset, "run.audit=true"), run_dir, progress=False)
    marker = json.loads((run_dir / MARKER_NAME).read_text())
    assert marker["command"] == "train"
    assert foreign_entries(run_dir, "train", RUN_PATTERNS) == []
    (run_dir / "checkpoints" / "mine.txt").write_text("x")
    (run_dir / "hospitals" / "client_00" / "checkpoints" / "notes.md").write_text("x")
    assert foreign_entries(run_dir, "train", RUN_PATTERNS) == [
        "checkpoints/mine.txt",
        "hospitals/client_00/checkpoints/notes.md",
    ]


def test_overwrite_of_a_folder_without_the_marker_is_refused(dataset: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "summary.json").write_text("{}")
    (notes / "keep.txt").write_text("mine")
    with pytest.raises(FederationError, match=rf"--out {notes} was not made by gastric-fl train"):
        train(_config(dataset), notes, overwrite=True, progress=False)
    assert (notes / "keep.txt").read_text() == "mine"


def test_process_start_time_tells_a_reused_pid_apart() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = pids.process_start_time(child.pid)
        assert isinstance(started, int)
        assert pids.same_process(child.pid, started)
        assert not pids.same_process(child.pid, started + 1)  # the pid now belongs to another process
        assert pids.same_process(child.pid, None)  # records written before start times: the pid decides
    finally:
        child.kill()
        child.wait()
    assert pids.process_start_time(child.pid) is None
    assert not pids.same_process(child.pid, started)


def test_is_live_run_compares_the_process_start_time(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = pids.process_start_time(child.pid)
        summary = {"status": "running", "pid": child.pid, "pid_started": started}
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        assert is_live_run(tmp_path)
        (tmp_path / "summary.json").write_text(json.dumps({**summary, "pid_started": (started or 0) + 7}))
        assert not is_live_run(tmp_path)
    finally:
        child.kill()
        child.wait()


def test_checkpoint_readers_ignore_temp_files_and_the_next_start_removes_them(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "round_0001.safetensors").write_bytes(b"x")
    (folder / "round_0001.json").write_text("{}")
    temps = [folder / ".round_0002.safetensors.ab12cd", folder / ".round_0002.json.ef34", tmp_path / ".summary.json.x1"]
    for path in temps:
        path.write_bytes(b"")
    assert complete_checkpoints(tmp_path) == [1]
    removed = clean_temp_files(tmp_path)
    assert sorted(removed) == sorted(temps)
    assert not any(p.exists() for p in temps)
    assert (folder / "round_0001.safetensors").exists()


def test_a_hospital_removes_its_own_temp_files_at_hello(dataset: Path, tmp_path: Path) -> None:
    folder = tmp_path / "client_00"
    (folder / "checkpoints").mkdir(parents=True)
    temps = [folder / "checkpoints" / ".round_0001.safetensors.99", folder / ".model.safetensors.99"]
    for path in temps:
        path.write_bytes(b"")
    (folder / "mine.txt").write_text("x")
    from federation.config import config_to_toml
    from federation.wire.contract import Hello, HelloReply

    reply = Hospital(Site(dataset, 0, folder)).handle(Hello("r", config_to_toml(_config(dataset)), False))
    assert isinstance(reply, HelloReply)
    assert not any(p.exists() for p in temps)
    assert (folder / "mine.txt").read_text() == "x"


def test_a_resume_names_a_damaged_summary_and_a_failed_run_may_change_any_setting(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text("{cut off")
    warnings: list[str] = []
    with pytest.raises(FederationError, match=rf"^{summary} is not valid JSON \(Expecting property name"):
        open_for_resume(tmp_path, "data", None, warnings.append)
    (tmp_path / "config.toml").write_text(config_to_toml(load_config(None, [])))
    with pytest.raises(FederationError, match="a resumed run keeps its configuration"):
        load_run_config(tmp_path, ["client.lr=0.5"])  # the status is unknown: the run is not taken for failed
    summary.write_text(json.dumps({"status": "failed"}))
    assert load_run_config(tmp_path, ["client.lr=0.5"]).client.lr == 0.5  # failed before its first checkpoint


def test_keep_rounds_reports_damaged_lines_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2\n{"round": 2}\n{"round": 3}\n{"rou')
    damaged = keep_rounds(path, 2)
    assert [str(d) for d in damaged] == [
        f"{path}, line 2: not valid JSON (Expecting ',' delimiter)",
        f"{path}, line 5: cut off (not valid JSON)",
    ]
    assert path.read_text() == '{"round": 1}\n{"round": 2}\n'


# -- the dashboard's jobs: a reused pid is neither "running" nor signalled -------------------------------------------
def test_a_job_whose_pid_was_reused_is_not_running_and_not_signalled(tmp_path: Path) -> None:
    job = jobs.start(tmp_path, "j1", "train", tmp_path / "run", [["sleep", "30"]], cwd=tmp_path)
    process = jobs._PROCESSES[job.pid]
    try:
        assert job.pid_started is not None
        assert jobs.state(tmp_path, job).status == "running"
        record = json.loads((tmp_path / "j1.json").read_text())
        record["pid_started"] = record["pid_started"] + 5  # as if the dashboard restarted and the pid was reused
        (tmp_path / "j1.json").write_text(json.dumps(record))
        reused = jobs.load(tmp_path, "j1")
        assert reused is not None
        jobs._PROCESSES.pop(job.pid)  # a restarted dashboard knows only the record
        assert jobs.state(tmp_path, reused).status == "lost"
        jobs.stop(tmp_path, reused)
        time.sleep(0.2)
        assert process.poll() is None  # the process that now has the pid was not signalled
    finally:
        os.killpg(job.pid, 9)
        process.wait()
    assert jobs.stop_pid(job.pid, started=(job.pid_started or 0) + 5) is False


def test_an_old_job_record_without_a_start_time_still_loads(tmp_path: Path) -> None:
    record = {
        "job_id": "old",
        "kind": "train",
        "target": str(tmp_path),
        "commands": [["true"]],
        "pid": 999999,
        "started": 0.0,
        "log": str(tmp_path / "old.log"),
        "stop_requested": False,
    }
    (tmp_path / "old.json").write_text(json.dumps(record))
    job = jobs.load(tmp_path, "old")
    assert job is not None
    assert job.pid_started is None


# -- gastric-fl ablate: one ablation per folder, write faults as one line ----------------------------------------------
def test_a_second_ablate_into_the_same_folder_is_refused(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main
    from infra.outputs import claim_output

    out = tmp_path / "abl"
    args = ["gastric-fl", "ablate", "--config", "configs/demo.toml", "--grid", "nhead=0", "--data", str(dataset)]
    monkeypatch.setattr(sys, "argv", [*args, "--out", str(out), "-q"])
    with claim_output(out, "ablate"), pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: --out {out} is being written by gastric-fl ablate (pid ")
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(sys, "argv", [*args, "--out", str(tmp_path / "file" / "abl"), "-q"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "a part of the path is a file, not a folder: choose another --out" in err.strip().splitlines()[-1]


def test_a_hospital_that_cannot_write_its_folder_answers_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk at a hospital (its checkpoint write fails) is a one-line Failure, not a traceback."""
    dataset = make_dataset(tmp_path / "d")
    hospital = Hospital(Site(dataset, 0, tmp_path / "h0"))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "h0" / "hospital.json"))

    monkeypatch.setattr("federation.hospital.handler.write_json", full)
    config = load_config(None, [*TINY_SETTINGS], data=dataset)
    reply = hospital.handle(Hello("run", config_to_toml(config)))
    assert isinstance(reply, Failure)
    assert reply.reason == f"hospital 0 cannot write {tmp_path / 'h0' / 'hospital.json'}: No space left on device"


def test_a_full_disk_at_the_servers_checkpoint_is_one_line_and_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors' own error for a failed write (``SafetensorError``, not an ``OSError``, so the CLI's write-fault
    line did not catch it) becomes one line naming the folder and what to do; nothing half-written is left. (An
    ``OSError`` keeps the CLI's own line: tests/app/test_train_reliability.py.)"""
    import safetensors.torch
    import torch
    from safetensors import SafetensorError

    from federation.runs import Checkpoint, write_checkpoint

    checkpoint = Checkpoint(3, [0, 1], {"w": torch.ones(2)}, {}, None)

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(FederationError) as raised:
        write_checkpoint(tmp_path, checkpoint, keep=2)
    assert str(raised.value) == (
        f"the server cannot write its checkpoint of round 3 in {tmp_path / 'checkpoints'} (Error while serializing: "
        "IoError(Os { code: 28, kind: StorageFull })); free space there, then continue with --resume"
    )
    monkeypatch.undo()
    assert complete_checkpoints(tmp_path) == []  # nothing half-written: no tensors file, no sidecar
    assert list((tmp_path / "checkpoints").glob(".*")) == []
