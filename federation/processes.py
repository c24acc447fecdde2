"""Whether a process still runs. Plain ``os`` only (no torch), so that the dashboard can ask it cheaply."""

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
