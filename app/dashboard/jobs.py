"""Background work started from the dashboard: ``gastric-fl`` commands in their own process group.

A job outlives the page (and a page reload): its process id, command and log live in a small JSON record under
``<data>/.dashboard/jobs/``, outside the documented run folders. The command runs under ``sh`` which writes the
exit code to ``<job>.exit`` when the command ends, so a finished job is told from a stopped one even after the
dashboard itself restarted. Stopping sends SIGTERM to the whole process group (the shell and the command).

A record names its process by pid *and* start time (``pid_started``): after a restart of the dashboard (or of the
machine) the pid of a finished job may belong to another process, which must neither show the job as running nor
receive its SIGTERM (issue 10, the dashboard's side of defect 13).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.dashboard.errors import DashboardError
from federation import processes

# Popen objects of jobs this dashboard process started: polling them reaps the finished child (no zombie).
_PROCESSES: dict[int, subprocess.Popen[bytes]] = {}
STOPPED_EXIT = 130  # gastric-fl train's exit code when stopped (app/cmd_train.py)
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Job:
    """One background command: what it is for (``kind`` and ``target`` folder), its process and its log."""

    job_id: str
    kind: str
    target: str
    commands: list[list[str]]
    pid: int
    started: float
    log: str
    stop_requested: bool = False
    pid_started: int | None = None  # the process's start time (federation.processes); None in older records


@dataclass(frozen=True)
class JobState:
    """``running``, ``succeeded``, ``failed`` (exit code != 0), ``stopped`` (by the user) or ``lost``."""

    status: str
    exit_code: int | None

    @property
    def active(self) -> bool:
        """Whether the process is still working."""
        return self.status == "running"


def _record_path(jobs_dir: Path, job_id: str) -> Path:
    return jobs_dir / f"{job_id}.json"


def _write_record(jobs_dir: Path, job: Job) -> None:
    # Write-then-rename: a reader never sees half a record.
    path = _record_path(jobs_dir, job.job_id)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(job), indent=2), encoding="utf-8")
    tmp.replace(path)


def start(jobs_dir: Path, job_id: str, kind: str, target: Path, commands: list[list[str]], cwd: Path) -> Job:
    """Run ``commands`` one after the other (stopping at the first failure) in a new process group.

    Output goes to ``<job_id>.log``; the shell writes the exit code to ``<job_id>.exit`` when done.
    """
    if not _JOB_ID.match(job_id):
        raise DashboardError(f"job id {job_id!r} may hold only letters, digits, '.', '_' and '-'")
    if not commands:
        raise DashboardError("nothing to run")
    jobs_dir.mkdir(parents=True, exist_ok=True)
    if _record_path(jobs_dir, job_id).exists():
        raise DashboardError(f"a job named {job_id} already exists in {jobs_dir}; choose another name")
    log = jobs_dir / f"{job_id}.log"
    exit_file = jobs_dir / f"{job_id}.exit"
    script = " && ".join(shlex.join(c) for c in commands)
    # `exec` is avoided on purpose: the shell must outlive the command to record its exit code. Its TERM trap
    # (reset to the default in the command, unlike an ignored signal) lets it write the code after a stop.
    wrapped = f"trap 'true' TERM INT; ( {script} ); code=$?; echo $code > {shlex.quote(str(exit_file))}.tmp; "
    wrapped += f"mv {shlex.quote(str(exit_file))}.tmp {shlex.quote(str(exit_file))}; exit $code"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["/bin/sh", "-c", wrapped],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: survives the page, stopped as a whole
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    _PROCESSES[process.pid] = process
    started = processes.process_start_time(process.pid)
    job = Job(job_id, kind, str(target), commands, process.pid, time.time(), str(log), pid_started=started)
    _write_record(jobs_dir, job)
    return job


def load(jobs_dir: Path, job_id: str) -> Job | None:
    """The record of one job, or ``None``."""
    path = _record_path(jobs_dir, job_id)
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return Job(**data)
    except (json.JSONDecodeError, TypeError):
        return None


def list_jobs(jobs_dir: Path, kind: str | None = None) -> list[Job]:
    """All job records (of one ``kind`` if given), newest first."""
    if not jobs_dir.is_dir():
        return []
    found = [load(jobs_dir, p.stem) for p in jobs_dir.glob("*.json")]
    jobs = [j for j in found if j is not None and (kind is None or j.kind == kind)]
    return sorted(jobs, key=lambda j: j.started, reverse=True)


def for_target(jobs_dir: Path, target: Path) -> Job | None:
    """The newest job that writes into ``target`` (e.g. a run folder), if the dashboard started one."""
    wanted = str(target.resolve())
    for job in list_jobs(jobs_dir):
        if str(Path(job.target).resolve()) == wanted:
            return job
    return None


def _alive(pid: int, started: int | None = None) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``started`` (when known)."""
    process = _PROCESSES.get(pid)
    if process is not None:
        return process.poll() is None
    return processes.same_process(pid, started)


def state(jobs_dir: Path, job: Job) -> JobState:
    """What became of a job; the exit-code file decides, the process table only says if it still runs."""
    exit_file = jobs_dir / f"{job.job_id}.exit"
    if exit_file.is_file():
        try:
            code = int(exit_file.read_text().strip())
        except ValueError:
            code = None
        _alive(job.pid, job.pid_started)  # reap it if it is our child
        if code == 0:
            return JobState("succeeded", code)
        # 130: `gastric-fl train` stopped by SIGTERM/Ctrl-C (resumable); 143: a command killed by SIGTERM.
        if job.stop_requested or code in (STOPPED_EXIT, 143):
            return JobState("stopped", code)
        return JobState("failed", code)
    if _alive(job.pid, job.pid_started):
        return JobState("running", None)
    return JobState("stopped" if job.stop_requested else "lost", None)


def stop(jobs_dir: Path, job: Job) -> Job:
    """SIGTERM to the job's process group (the shell and everything it started); records that it was asked.

    Nothing is sent when the pid now belongs to another process (the job ended while the dashboard was away).
    """
    job = Job(**{**asdict(job), "stop_requested": True})
    _write_record(jobs_dir, job)
    if _alive(job.pid, job.pid_started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, signal.SIGTERM)
    return job


def log_tail(job: Job, lines: int = 20) -> str:
    """The last ``lines`` lines the job printed."""
    path = Path(job.log)
    if not path.is_file():
        return ""
    text = path.read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.rstrip("\n").split("\n")[-lines:])


def describe(job: Job) -> str:
    """The job's commands as a person would type them."""
    return " && ".join(shlex.join(c) for c in job.commands)


def run_status(summary_status: str, job_state: JobState | None, pid_alive: bool | None = None) -> str:
    """A run's status as shown: ``summary.json`` decides once it says finished, failed or stopped; before that, the
    process that writes it does (a run whose process died or was stopped is not "running" any more).

    ``job_state`` is ``None`` for runs started outside the dashboard: then ``pid_alive`` (is the ``pid`` of
    ``summary.json`` still there?) tells a running run from one that was killed (data/README.md section 3).
    """
    if summary_status in ("finished", "failed", "stopped"):
        return summary_status
    if job_state is None:
        return "stopped" if summary_status == "running" and pid_alive is False else summary_status
    if job_state.status == "running":
        return "running"
    if job_state.status == "failed":
        return "failed"
    return "stopped"


def pid_alive(pid: int | None, started: int | None = None) -> bool | None:
    """Whether process ``pid`` (started at ``started``: ``summary.json``'s ``pid_started``, when known) still runs
    (``None`` when there is no pid to check)."""
    return None if pid is None else _alive(pid, started)


def stop_pid(pid: int, started: int | None = None) -> bool:
    """SIGTERM to a run started outside the dashboard (``summary.json``'s ``pid`` and ``pid_started``); the engine
    stops cleanly. Returns whether a signal was sent: not when the pid now belongs to another process."""
    if not processes.same_process(pid, started):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True
