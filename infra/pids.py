"""Whether a process still runs, and whether it is still the same process. Plain ``os`` only (no torch), so that the
dashboard can ask it cheaply.

A pid alone is not an identity: after a reboot or a long uptime the pid of a dead run is reused by another process
(issue 10, defect 13: a stale ``running`` status pointed at pid 1 and blocked the run). Records that name a process
therefore keep its start time as well (`process_start_time`), and `same_process` compares both.
"""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and has not exited.

    A process owned by another user counts as alive. A zombie (exited, not yet reaped by its parent) still answers
    ``kill(pid, 0)``; its state letter in ``/proc/<pid>/stat`` says it is gone. Where ``/proc`` cannot be read, a
    process that answers counts as alive.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); ``None`` if unknown.

    Together with the pid it names one process: a later process that is given the same pid starts later.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # fields after the command name (which may hold spaces and parentheses): state is field 3, starttime 22
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, started: int | None) -> bool:
    """True while ``pid`` is alive and is the process that started at ``started`` (as `process_start_time` said).

    ``started=None`` (a record written before start times were kept) trusts the pid; so does a system where the
    start time cannot be read.
    """
    if not pid_alive(pid):
        return False
    if started is None:
        return True
    now = process_start_time(pid)
    return now is None or now == started
