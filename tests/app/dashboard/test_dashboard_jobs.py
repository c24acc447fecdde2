"""Background jobs (survive the page, stoppable as a process group) and the `gastric-fl dashboard` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.dashboard import wait_until

from app.cmd_dashboard import streamlit_command
from app.dashboard import jobs
from app.errors import DashboardError

WAIT_S = 20.0


def test_job_records_exit_code_and_log(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    ok = jobs.start(folder, "ok", "demo", tmp_path / "out", [[sys.executable, "-c", "print('tiles ready')"]], tmp_path)
    bad = jobs.start(
        folder,
        "bad",
        "demo",
        tmp_path / "out2",
        [[sys.executable, "-c", "print('first')"], [sys.executable, "-c", "import sys; sys.exit(3)"]],
        tmp_path,
    )
    wait_until(lambda: not jobs.state(folder, ok).active and not jobs.state(folder, bad).active, WAIT_S)
    assert jobs.state(folder, ok) == jobs.JobState("succeeded", 0)
    assert jobs.state(folder, bad) == jobs.JobState("failed", 3)
    assert jobs.log_tail(ok) == "tiles ready"
    assert jobs.log_tail(bad) == "first"
    # The records survive this process: a fresh reader (a reloaded page) finds them again.
    assert [j.job_id for j in jobs.list_jobs(folder)] == ["bad", "ok"]
    assert jobs.for_target(folder, tmp_path / "out") == ok
    with pytest.raises(DashboardError, match="already exists"):
        jobs.start(folder, "ok", "demo", tmp_path / "out", [["true"]], tmp_path)


def test_a_training_that_ends_without_a_hospital_is_incomplete_not_failed(tmp_path: Path) -> None:
    # gastric-fl train exits 3 when the run finished without a hospital (app/cmd_train.py); any other command's
    # exit 3, and a training's exit 1, are failures.
    folder = tmp_path / "jobs"
    code3 = [[sys.executable, "-c", "import sys; sys.exit(3)"]]
    left_out = jobs.start(folder, "left", jobs.TRAIN_KIND, tmp_path / "a", code3, tmp_path)
    crashed = jobs.start(
        folder, "crash", jobs.TRAIN_KIND, tmp_path / "b", [[sys.executable, "-c", "raise SystemExit(1)"]], tmp_path
    )
    wait_until(lambda: not jobs.state(folder, left_out).active and not jobs.state(folder, crashed).active, WAIT_S)
    assert jobs.state(folder, left_out) == jobs.JobState("incomplete", 3)
    assert jobs.state(folder, crashed) == jobs.JobState("failed", 1)


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    child = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    child += "; print(p.pid, flush=True); time.sleep(60)"
    job = jobs.start(folder, "long", "train", tmp_path / "run", [[sys.executable, "-c", child]], tmp_path)
    wait_until(lambda: jobs.log_tail(job).strip().isdigit(), WAIT_S)
    grandchild = int(jobs.log_tail(job).strip())
    assert jobs.state(folder, job).status == "running"
    stopped = jobs.stop(folder, job)
    wait_until(lambda: not jobs.state(folder, stopped).active, WAIT_S)
    # The shell outlives the stopped command and records its exit code (143: killed by SIGTERM).
    assert jobs.state(folder, stopped) == jobs.JobState("stopped", 143)
    wait_until(lambda: not _alive(grandchild), WAIT_S)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_run_status_prefers_the_summary_then_the_process() -> None:
    running = jobs.JobState("running", None)
    assert jobs.run_status("finished", running) == "finished"
    assert jobs.run_status("failed", None) == "failed"
    assert jobs.run_status("stopped", running) == "stopped"  # the engine wrote it before its process ended
    assert jobs.run_status("running", None) == "running"  # started elsewhere: the summary is all there is
    assert jobs.run_status("running", running) == "running"
    assert jobs.run_status("running", jobs.JobState("failed", 2)) == "failed"
    assert jobs.run_status("running", jobs.JobState("stopped", None)) == "stopped"
    assert jobs.run_status("running", jobs.JobState("lost", None)) == "stopped"
    # Started from a terminal: summary.json's pid tells a live run from a killed one.
    assert jobs.run_status("running", None, pid_alive=True) == "running"
    assert jobs.run_status("running", None, pid_alive=False) == "stopped"
    assert jobs.pid_alive(os.getpid()) is True
    assert jobs.pid_alive(None) is None


def test_streamlit_runs_on_loopback_without_telemetry() -> None:
    command = streamlit_command("127.0.0.1", 8765)
    pairs = dict(zip(command[5::2], command[6::2], strict=False))
    assert command[1:4] == ["-m", "streamlit", "run"]
    assert Path(command[4]).name == "main.py"
    assert pairs["--server.address"] == "127.0.0.1"
    assert pairs["--server.port"] == "8765"
    assert pairs["--server.headless"] == "true"
    assert pairs["--browser.gatherUsageStats"] == "false"
    assert pairs["--server.fileWatcherType"] == "none"


def test_dashboard_refuses_a_file_as_data_root(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "data.txt"
    not_a_folder.write_text("x")
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "dashboard", "--data", str(not_a_folder)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "is a file" in result.stderr


def test_a_terminal_run_whose_pid_was_reused_reads_as_stopped(tmp_path: Path) -> None:
    # summary.json names this very process, but with another start time: the pid now belongs to someone else
    from app.run_records import run_info
    from infra.pids import process_start_time

    run = tmp_path / "run"
    run.mkdir()
    started = process_start_time(os.getpid())
    assert started is not None
    (run / "summary.json").write_text(f'{{"status": "running", "pid": {os.getpid()}, "pid_started": {started + 1}}}')
    info = run_info(run)
    assert info.pid_started == started + 1
    assert jobs.pid_alive(info.pid, info.pid_started) is False
    assert jobs.pid_alive(info.pid, started) is True
    assert jobs.stop_pid(info.pid, info.pid_started) is False  # never signals a stranger
