"""Background work started from the dashboard: ``gastric-fl`` commands in their own process group.

A job outlives the page (and a page reload): its process id, command and log live in a small JSON record under
``<data>/.dashboard/jobs/``, outside the documented run folders. The command runs under ``sh`` which writes the
exit code to ``<job>.exit`` when the command ends, so a finished job is told from a stopped one even after the
dashboard itself restarted. Stopping sends SIGTERM to the whole process group (the shell and the command).

A record names its process by pid *and* start time (``pid_started``): after a restart of the dashboard (or of the
machine) the pid of a finished job may belong to another process, which must neither show the job as running nor
receive its SIGTERM (issue 10, the dashboard's side of defect 13).

Two trainings never run at once: every ``gastric-fl train`` the dashboard starts goes through `start_training`,
which refuses while another is running, under a file lock (``<data>/.dashboard/queue.lock``). Runs that should
follow one another (the ablation launcher's grid) wait in a queue file, ``<data>/.dashboard/queue.json``, which a
runner thread of the dashboard's process works through one entry at a time (`ensure_runner`). The queue is a file,
so it survives a page reload and a restart of the dashboard; the runner lives only as long as the dashboard.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from app.errors import DashboardError
from federation.run_reader import ENDED
from infra import pids
from infra.outputs import write_atomic

# Popen objects of jobs this dashboard process started: polling them reaps the finished child (no zombie).
_PROCESSES: dict[int, subprocess.Popen[bytes]] = {}
STOPPED_EXIT = 130  # gastric-fl train's exit code when stopped (app/cmd_train.py)
LEFT_OUT_EXIT = 3  # gastric-fl train's exit code when the run finished without a hospital (app/cmd_train.py)
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
    pid_started: int | None = None  # the process's start time (infra.pids); None in older records
    title: str = ""  # what the job does, in a plain sentence ("Training FedSAF on demo, 4 rounds")


@dataclass(frozen=True)
class JobState:
    """``running``, ``succeeded``, ``incomplete`` (a training that finished without a hospital: exit code 3),
    ``failed`` (any other exit code != 0), ``stopped`` (by the user) or ``lost``."""

    status: str
    exit_code: int | None

    @property
    def active(self) -> bool:
        """Whether the process is still working."""
        return self.status == "running"


def _record_path(jobs_dir: Path, job_id: str) -> Path:
    return jobs_dir / f"{job_id}.json"


def _write_record(jobs_dir: Path, job: Job) -> None:
    # a reader never sees half a record (infra.outputs.write_atomic)
    write_atomic(_record_path(jobs_dir, job.job_id), json.dumps(asdict(job), indent=2).encode("utf-8"))


def start(
    jobs_dir: Path, job_id: str, kind: str, target: Path, commands: list[list[str]], cwd: Path, title: str = ""
) -> Job:
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
    started = pids.process_start_time(process.pid)
    job = Job(job_id, kind, str(target), commands, process.pid, time.time(), str(log), pid_started=started, title=title)
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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError):
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
    return pids.same_process(pid, started)


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
        if job.kind == TRAIN_KIND and code == LEFT_OUT_EXIT:
            return JobState("incomplete", code)
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
        pids.signal_group(job.pid, signal.SIGTERM)  # a request: the job's own handler ends it
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
    if summary_status in ENDED:
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
    if not pids.same_process(pid, started):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --- one training at a time, and the queue -------------------------------------------------------------------------

TRAIN_KIND = "train"
QUEUE_FILE = "queue.json"
LOCK_FILE = "queue.lock"
QUEUED, CANCELLED = "queued", "cancelled"
Busy = Callable[[], str | None]  # says why training must wait (e.g. a run started from a terminal), or None


def active_train(jobs_dir: Path) -> Job | None:
    """The training the dashboard started (from the Federation page or the queue) that is still running, if any."""
    for job in list_jobs(jobs_dir, kind=TRAIN_KIND):
        if state(jobs_dir, job).active:
            return job
    return None


@contextlib.contextmanager
def _locked(jobs_dir: Path) -> Iterator[None]:
    """Hold the lock ``<data>/.dashboard/queue.lock`` (``flock``): one decision to start training at a time, across
    the dashboard's threads, its sessions and a second dashboard on the same data folder."""
    jobs_dir.parent.mkdir(parents=True, exist_ok=True)
    with (jobs_dir.parent / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _why_busy(jobs_dir: Path, busy: Busy | None) -> str | None:
    running = active_train(jobs_dir)
    if running is not None:
        return f"{running.title or running.job_id} is still training"
    return busy() if busy is not None else None


def start_training(
    jobs_dir: Path, job_id: str, target: Path, command: list[str], cwd: Path, title: str, busy: Busy | None = None
) -> Job:
    """Start one ``gastric-fl train`` command unless a training is running already (a ``DashboardError`` says
    which): two trainings never share the machine, whoever starts them (the page or the queue)."""
    with _locked(jobs_dir):
        reason = _why_busy(jobs_dir, busy)
        if reason:
            raise DashboardError(f"Not started: {reason}. Wait for it to end, or queue this run on the Compare page.")
        return start(jobs_dir, job_id, TRAIN_KIND, target, [command], cwd, title)


@dataclass(frozen=True)
class QueueEntry:
    """A training waiting its turn: the command, the run folder it writes, and what the launcher varied.

    ``entry_id`` becomes the job's id when it starts (``started``); ``batch`` groups the runs of one launch.
    """

    entry_id: str
    batch: str
    title: str
    target: str
    command: list[str]
    params: dict[str, Any]
    added: float
    started: bool = False
    cancelled: bool = False


def queue_path(jobs_dir: Path) -> Path:
    """The queue file, ``<data>/.dashboard/queue.json`` (beside the job records, outside the run folders)."""
    return jobs_dir.parent / QUEUE_FILE


def read_queue(jobs_dir: Path) -> list[QueueEntry]:
    """The queue in order (oldest first); empty when there is none. A damaged file is a one-line ``DashboardError``
    naming it: the queue then stops until the file is removed."""
    path = queue_path(jobs_dir)
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [QueueEntry(**item) for item in data["entries"]]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DashboardError(
            f"{path} is damaged ({type(exc).__name__}: {exc}); delete it to empty the queue (runs already made stay)"
        ) from exc


def _write_queue(jobs_dir: Path, entries: Sequence[QueueEntry]) -> None:
    path = queue_path(jobs_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"version": 1, "entries": [asdict(e) for e in entries]}, indent=2).encode("utf-8"))


def enqueue(jobs_dir: Path, entries: Sequence[QueueEntry]) -> None:
    """Append ``entries`` to the queue; refused (nothing added) when an id is taken or a run folder exists."""
    with _locked(jobs_dir):
        queue = read_queue(jobs_dir)
        taken = {e.entry_id for e in queue} | {j.job_id for j in list_jobs(jobs_dir)}
        targets = {str(Path(e.target).resolve()) for e in queue if not e.cancelled}
        for entry in entries:
            if not _JOB_ID.match(entry.entry_id):
                raise DashboardError(f"queue entry {entry.entry_id!r} may hold only letters, digits, '.', '_', '-'")
            if entry.entry_id in taken:
                raise DashboardError(f"a job named {entry.entry_id} exists already; launch with another name")
            if str(Path(entry.target).resolve()) in targets or Path(entry.target).exists():
                raise DashboardError(f"{entry.target} is taken by another run; launch with another name")
            taken.add(entry.entry_id)
            targets.add(str(Path(entry.target).resolve()))
        _write_queue(jobs_dir, [*queue, *entries])


def cancel(jobs_dir: Path, entry_id: str) -> bool:
    """Take a waiting entry out of turn (it stays listed as cancelled); ``False`` if it started or is unknown."""
    with _locked(jobs_dir):
        queue = read_queue(jobs_dir)
        for i, entry in enumerate(queue):
            if entry.entry_id == entry_id and not entry.started and not entry.cancelled:
                queue[i] = replace(entry, cancelled=True)
                _write_queue(jobs_dir, queue)
                return True
    return False


def entry_status(jobs_dir: Path, entry: QueueEntry) -> str:
    """``queued``, ``cancelled``, or its job's status once started (``running``, ``succeeded``, ``incomplete``,
    ``failed``, ``stopped``, ``lost``)."""
    if entry.cancelled:
        return CANCELLED
    if not entry.started:
        return QUEUED
    job = load(jobs_dir, entry.entry_id)
    return state(jobs_dir, job).status if job is not None else "lost"


def clear_finished(jobs_dir: Path) -> int:
    """Drop the entries that are done (ended or cancelled) from the list; returns how many. Their runs stay."""
    with _locked(jobs_dir):
        queue = read_queue(jobs_dir)
        keep = [e for e in queue if entry_status(jobs_dir, e) in (QUEUED, "running")]
        _write_queue(jobs_dir, keep)
    return len(queue) - len(keep)


def advance(jobs_dir: Path, cwd: Path, busy: Busy | None = None) -> Job | None:
    """If no training is running, start the oldest waiting entry (returned); otherwise do nothing (``None``)."""
    with _locked(jobs_dir):
        if _why_busy(jobs_dir, busy):
            return None
        queue = read_queue(jobs_dir)
        for i, entry in enumerate(queue):
            if entry.started or entry.cancelled:
                continue
            queue[i] = replace(entry, started=True)
            _write_queue(jobs_dir, queue)  # first: a failed start must not be retried forever
            try:
                return start(
                    jobs_dir, entry.entry_id, TRAIN_KIND, Path(entry.target), [entry.command], cwd, entry.title
                )
            except (DashboardError, OSError) as exc:
                print(f"gastric-fl dashboard: queued run {entry.entry_id} did not start: {exc}", file=sys.stderr)
                return None
    return None


def has_work(jobs_dir: Path) -> bool:
    """Whether the queue holds an entry waiting or running. Read under the queue's lock: ``advance`` marks an entry
    started and then writes its job's record, and between the two the entry would read as ``lost``."""
    try:
        with _locked(jobs_dir):
            return any(entry_status(jobs_dir, e) in (QUEUED, "running") for e in read_queue(jobs_dir))
    except DashboardError:
        return False


# The queue's runner: one thread per data folder in the dashboard's process, alive while the queue has work.
_RUNNERS: dict[str, threading.Thread] = {}
_RUNNERS_LOCK = threading.Lock()


def ensure_runner(jobs_dir: Path, cwd: Path, busy: Busy | None = None, interval_s: float = 2.0) -> bool:
    """Make sure the queue is being worked through: start the runner thread unless it runs or there is nothing
    to do. Returns whether a runner is alive.

    The runner is a daemon thread of the dashboard's process: when the dashboard stops, it stops, and no later
    entry starts; the training it started last runs on to its end in its own process group (like a run started
    from the Federation page), and the entries still waiting start when the dashboard is opened again.
    """
    key = str(jobs_dir.resolve())
    with _RUNNERS_LOCK:
        thread = _RUNNERS.get(key)
        if thread is not None and thread.is_alive():
            return True
        if not has_work(jobs_dir):
            return False
        thread = threading.Thread(
            target=_run_queue, args=(jobs_dir, cwd, busy, interval_s), name=f"gastric-fl queue {key}", daemon=True
        )
        _RUNNERS[key] = thread
        thread.start()
        return True


def _run_queue(jobs_dir: Path, cwd: Path, busy: Busy | None, interval_s: float) -> None:
    """The runner's loop: start the next entry whenever no training runs; leave once nothing waits or runs."""
    key = str(jobs_dir.resolve())
    while True:
        try:
            advance(jobs_dir, cwd, busy)
        except Exception as exc:  # a damaged queue file, a full disk: say it in the terminal, stop the runner
            print(f"gastric-fl dashboard: the run queue stopped: {exc}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            with _RUNNERS_LOCK:
                _RUNNERS.pop(key, None)
            return
        with _RUNNERS_LOCK:
            if not has_work(jobs_dir):
                _RUNNERS.pop(key, None)
                return
        time.sleep(interval_s)
