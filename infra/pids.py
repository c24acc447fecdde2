"""Processes and process groups: whether a process still runs and is still the same process, and stopping the
process group of a command this project started (SIGTERM, then SIGKILL after a grace period; by group, never by
name). Plain ``os`` and ``/proc`` only (no torch), so that the dashboard can ask it cheaply.

A pid alone is not an identity: after a reboot or a long uptime the pid of a dead run is reused by another process
(issue 10, defect 13: a stale ``running`` status pointed at pid 1 and blocked the run). Records that name a process
therefore keep its start time as well (`process_start_time`), and `same_process` compares both.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Mapping
from typing import NamedTuple


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses): state is
    ``[0]``, the parent ``[1]``, the process group ``[2]``, the start time ``[19]``; ``None`` if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


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
    fields = _stat_fields(pid)
    return not fields or fields[0] != "Z"


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); ``None`` if unknown.

    Together with the pid it names one process: a later process that is given the same pid starts later.
    """
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
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


STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


# -- process groups: one per command this project starts, stopped by group, never by name -----------------------------
class _Proc(NamedTuple):
    ppid: int
    pgid: int
    state: str
    start: int  # clock ticks after boot: tells a recycled pid from the process first seen


def _proc_table() -> dict[int, _Proc]:
    """``pid -> (ppid, pgid, state, start time)`` for every process readable in ``/proc``."""
    table: dict[int, _Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        try:
            if fields:
                table[int(entry.name)] = _Proc(int(fields[1]), int(fields[2]), fields[0], int(fields[19]))
        except (IndexError, ValueError):
            continue
    return table


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    return [pid for pid, proc in _proc_table().items() if proc.pgid == pgid and proc.state not in "ZX"]


def descendant_groups(pid: int) -> dict[int, int | None]:
    """Process groups of ``pid`` and its descendants (found by parent id, not by name): ``pgid -> start time of
    the group's leader`` (None when the leader is gone), so that a group id recycled later is not signalled."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for child, proc in table.items():
        children.setdefault(proc.ppid, []).append(child)
    groups: dict[int, int | None] = {}
    todo = [pid]
    while todo:
        current = todo.pop()
        if current in table:
            pgid = table[current].pgid
            groups[pgid] = table[pgid].start if pgid in table else None
        todo.extend(children.get(current, []))
    return groups


def still_ours(groups: Mapping[int, int | None]) -> set[int]:
    """The recorded groups that still exist and were not recycled: a pid is not reused while a group of that id
    has members, so a group is ours unless its id now leads a process that started at another time."""
    table = _proc_table()
    live = {proc.pgid for proc in table.values() if proc.state not in "ZX"}
    return {
        g for g, start in groups.items() if g in live and (start is None or g not in table or table[g].start == start)
    }


def signal_group(pgid: int, sig: int) -> bool:
    """``killpg``; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_groups(groups: Iterable[int], grace: float = STOP_GRACE) -> None:
    """SIGTERM every group, wait up to ``grace`` seconds for them to empty, SIGKILL what is left
    (``grace <= 0``: SIGKILL at once)."""
    pending = {g for g in groups if g > 1 and g != os.getpgrp()}
    for group in pending if grace > 0 else ():
        signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        pending = {g for g in pending if group_members(g)}
        if pending:
            time.sleep(0.1)
    for group in pending:
        signal_group(group, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while pending and time.monotonic() < deadline:
        pending = {g for g in pending if group_members(g)}
        if pending:
            time.sleep(0.05)
