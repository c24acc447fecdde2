"""pid_alive: a running process, an exited and reaped one, and a zombie (exited, not yet reaped)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.pids import group_members, pid_alive, stop_groups


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


def test_a_process_group_is_stopped_by_group_with_sigkill_after_the_grace() -> None:
    # a shell that ignores SIGTERM and a child of it: both in the group, both gone after SIGKILL
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "subprocess.Popen(['sleep', '60']); time.sleep(60)"],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while len(group_members(stubborn.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_members(stubborn.pid)) == 2
        stop_groups([stubborn.pid], grace=0.5)
        assert group_members(stubborn.pid) == []
        assert stubborn.wait(timeout=5) == -9  # SIGTERM was ignored: the group got SIGKILL after the grace
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()
