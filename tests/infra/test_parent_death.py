"""A hospital that stops, stops (issue 34, item 6): a child started through `infra.parent_death` ends when its
parent is SIGKILLed, though it runs in a session of its own; a wrapper whose parent is already gone never starts
its command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra import parent_death

pytestmark = pytest.mark.skipif(not parent_death.supported(), reason="prctl(PR_SET_PDEATHSIG) is Linux's")


def _gone(pid: int) -> bool:
    """No such process, or a zombie waiting for PID 1 to reap it (it runs nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_managed_process_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    """The parent plays ``gastric-fl federation hospital``: it starts a ``ManagedProcess`` (its own session) and
    is SIGKILLed, as a supervisor does; the child must not outlive it."""
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, pathlib, time
                from federation.flower.managed_process import ManagedProcess
                child = ManagedProcess("sleeper", ["sleep", "120"], log_path=pathlib.Path({str(tmp_path / "log")!r}),
                                       env=dict(os.environ), cwd=pathlib.Path({str(tmp_path)!r}))
                child.start()
                time.sleep(1.0)  # the wrapper has become sleep by now
                # written whole, then renamed: the test never reads a file that is still empty
                pathlib.Path({str(pid_file) + ".part"!r}).write_text(str(child.pid))
                os.replace({str(pid_file) + ".part"!r}, {str(pid_file)!r})
                time.sleep(120)
                """
            ),
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not pid_file.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        with open(f"/proc/{child}/cmdline", "rb") as handle:
            assert handle.read().split(b"\0")[0] == b"sleep"  # the wrapper became the command: the same pid
        assert os.getpgid(child) == child  # in a session of its own, so a kill of the parent's group misses it
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_gone(child), f"pid {child} outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait(timeout=10)
        if pid_file.is_file() and not _gone(int(pid_file.read_text())):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def test_a_wrapper_whose_parent_is_gone_never_runs_its_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = subprocess.run(
        [sys.executable, "-m", "infra.parent_death", "999999999", "--", "touch", str(marker)], check=False
    )
    assert result.returncode == parent_death.PARENT_GONE
    assert not marker.exists()
    ok = subprocess.run([*parent_death.wrapped(["touch", str(marker)])], check=False)
    assert ok.returncode == 0
    assert marker.exists()
    assert parent_death.main(["x", "--"]) == 2


def test_only_the_main_thread_asks_for_it() -> None:
    """The kernel signals when the starting *thread* ends: a child started from another thread is left alone."""
    import threading

    seen: list[list[str]] = []
    thread = threading.Thread(target=lambda: seen.append(parent_death.wrapped(["sleep", "1"])))
    thread.start()
    thread.join()
    assert seen == [["sleep", "1"]]
    assert parent_death.wrapped(["sleep", "1"])[-4:] == [str(os.getpid()), "--", "sleep", "1"]
