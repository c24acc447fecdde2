"""A child that ends when its parent ends, whatever kills the parent (Linux ``prctl(PR_SET_PDEATHSIG)``).

Our long-lived helpers (a hospital's executor and SuperNode, the server's SuperLink and gate) run in sessions of
their own, so that each is stopped by its own process group. A supervisor that SIGKILLs the group of
``gastric-fl federation hospital`` therefore used to leave them running under PID 1: the hospital believed it had
left and still answered the server. Started through `wrapped`, a child asks the kernel (``prctl(2)``,
``PR_SET_PDEATHSIG``) for SIGTERM the moment its parent ends, checks that the parent is still the one that started
it (it may have ended before the request), and only then becomes the command (``os.execvp``: the same process id,
so its process group and pid records hold; the request survives ``exec`` of a program that is not set-user-id).

``python -m infra.parent_death PARENT_PID -- COMMAND ...`` is that wrapper. The kernel sends the signal when the
*thread* that started the child ends, so `wrapped` applies it only to children started from the main thread;
others are left as they were (the atexit and ``with`` teardown still stop them when the parent ends normally).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_GONE = 3  # the wrapper's exit code when its parent ended before the request took hold


def supported() -> bool:
    """Whether a parent-death signal can be requested here (Linux)."""
    return sys.platform.startswith("linux")


def wrapped(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it ends with this process: the wrapper's command line when started from the main thread
    on Linux, else ``argv`` unchanged."""
    if not supported() or threading.current_thread() is not threading.main_thread():
        return list(argv)
    return [sys.executable, "-m", "infra.parent_death", str(os.getpid()), "--", *argv]


def request(parent: int, signum: int = signal.SIGTERM) -> bool:
    """Ask for ``signum`` when this process's parent ends; ``False`` when the parent is no longer ``parent``."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return os.getppid() == parent


def main(argv: Sequence[str] | None = None) -> int:
    """``PARENT_PID -- COMMAND ...``: request the signal, then become COMMAND (exit 2 on a bad command line)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m infra.parent_death PARENT_PID -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    if not request(int(args[0])):
        return PARENT_GONE
    command = args[2:]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"cannot start {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    return 0  # not reached: execvp replaced this process


if __name__ == "__main__":
    sys.exit(main())
