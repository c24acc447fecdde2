"""pid_alive: a running process, an exited and reaped one, and a zombie (exited, not yet reaped)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.pids import pid_alive


def test_running_process_is_alive() -> None:
    assert pid_alive(os.getpid()) is True


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs /proc")
def test_zombie_and_reaped_process_are_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # exited, not reaped: a zombie
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.02)
    assert pid_alive(child.pid) is False
    child.wait()
    assert pid_alive(child.pid) is False
