"""A child process in its own process group, stopped by group with its descendants' groups; a block that stops it.

Every process is started in its own session and process group (``start_new_session=True``) and stopped by
signalling that group (``os.killpg``: SIGTERM, then SIGKILL after a grace period), never by name. Flower starts
helpers of its own: the SuperLink launches ``flower-superexec`` *detached* in a new session
(``flwr.supercore.utils.get_popen_detach_kwargs``), which in turn starts one ``flwr-serverapp`` per run; a
SuperNode starts its ``flower-superexec`` and one ``flwr-clientapp`` per message inside its own group. So before a
group is signalled, its descendants are looked up in ``/proc`` (by parent id, not by name) and every other group
they lead is stopped as well. The helpers watch their parent with ``kill(pid, 0)``, which a zombie still answers,
so a stopped process is always reaped (``Popen.wait``). A process started from the main thread also ends when this
one ends, however it ends (SIGKILL included: ``infra.parent_death``), so that a supervisor that kills only our
group leaves nothing running.

The context managers (``ManagedProcess`` and its SuperLink, gate and SuperNode, and ``LocalDeployment``: every
``StoppedOnExit``) stop what they started when the block ends, raises, or is interrupted; while one is open in the
main thread, SIGTERM and SIGHUP (when they still have their default action) raise ``Terminated``, a
``KeyboardInterrupt``, so that the teardown runs. An ``atexit`` hook stops anything still running when the
interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from federation.errors import FederationError
from federation.flower.environment import dial_host
from federation.flower.kit import join_address
from infra import parent_death
from infra.outputs import Terminated as Terminated
from infra.outputs import terminate_as_interrupt
from infra.pids import STOP_GRACE, descendant_groups, still_ours, stop_groups

LOG_TAIL_LINES = 30


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


class StoppedOnExit:
    """Something a ``with`` block starts (``_start_block``) and stops (``_stop_block``) when the block ends, raises
    or is interrupted: until the block ends, SIGTERM/SIGHUP unwind like Ctrl-C so that ``__exit__`` stops it.

    A start that raises is undone by ``_undo_failed_start`` (a single process cleans up after itself, so by
    default nothing; a deployment stops whatever of it had started) before the signals are given back.
    """

    _signals: contextlib.AbstractContextManager[None] | None = None

    def _start_block(self) -> None:
        raise NotImplementedError

    def _stop_block(self) -> None:
        raise NotImplementedError

    def _undo_failed_start(self) -> None:
        """What ``__enter__`` does when the start raised (default: nothing)."""

    def __enter__(self) -> Self:
        """Start it; until the block ends, SIGTERM/SIGHUP unwind like Ctrl-C so that ``__exit__`` stops it."""
        self._signals = terminate_as_interrupt()
        self._signals.__enter__()
        try:
            self._start_block()
        except BaseException:
            try:
                self._undo_failed_start()
            finally:
                self._restore_signals(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._stop_block()
        finally:
            self._restore_signals(exc_type, exc, tb)

    def _restore_signals(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._signals is not None:
            self._signals.__exit__(exc_type, exc, tb)
            self._signals = None


_LIVE: set[ManagedProcess] = set()  # strong references: a dropped deployment is still stopped at exit


@atexit.register
def _stop_all_at_exit() -> None:
    for process in list(_LIVE):
        with contextlib.suppress(Exception):
            process.stop(grace=1.0)


class ManagedProcess(StoppedOnExit):
    """One command in its own session/process group, its output appended to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        self.env = dict(env)
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._groups: dict[int, int | None] = {}  # groups to stop: its own and its descendants' (detached helpers)
        self._seen: set[int] = set()  # every group ever recorded, for checks; never signalled after a stop

    @property
    def pid(self) -> int | None:
        """The process id (= its process group id) while started."""
        return None if self.popen is None else self.popen.pid

    @property
    def groups(self) -> set[int]:
        """Every process group this process and its descendants were seen in since it was first started."""
        self.track()
        return set(self._seen)

    def start(self) -> None:
        """Start the command in a new session; its stdout and stderr go to the log file."""
        if self.alive():
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n--- {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
        self._log.flush()
        try:
            self.popen = subprocess.Popen(
                parent_death.wrapped(self.argv),  # ends with this process, even under SIGKILL (infra.parent_death)
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise FederationError(f"cannot start {self.name} ({self.argv[0]}): {exc.strerror or exc}") from exc
        self._groups = descendant_groups(self.popen.pid) or {self.popen.pid: None}
        self._seen.update(self._groups)
        _LIVE.add(self)

    def alive(self) -> bool:
        """True while the main process runs (a dead one is reaped here)."""
        if self.popen is None:
            return False
        self.track()
        return self.popen.poll() is None

    def track(self) -> None:
        """Remember the groups of its current descendants, so that they can be stopped after it is gone."""
        if self.popen is not None and self.popen.returncode is None:
            self._groups.update(descendant_groups(self.popen.pid))
            self._seen.update(self._groups)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop its process group and every group its descendants lead; reap it; close the log."""
        if self.popen is None:
            return
        self.track()
        stop_groups(still_ours(self._groups), grace=grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5.0)
        self._groups = {}  # stopped: never signal these ids again (they may be recycled)
        self._close_log()
        _LIVE.discard(self)

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until it exits (``None``: no limit); its exit code, or None if still running after ``timeout``.

        For commands that run one process in the foreground: ``with SuperNode.from_bundle(...) as node:
        node.wait()`` (Ctrl-C or SIGTERM unwind the block and stop the node's whole group).
        """
        if self.popen is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.alive():
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.5)  # polled, not Popen.wait(): descendants' groups are tracked meanwhile
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL its group at once (a crash, as a test wants it); its detached helpers are stopped as well."""
        self.stop(grace=0.0)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its log file."""
        return _tail(self.log_path, lines)

    def log_text(self) -> str:
        """The whole log file."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _start_block(self) -> None:
        self.start()

    def _stop_block(self) -> None:
        self.stop()


class ListeningProcess(ManagedProcess):
    """A `ManagedProcess` that serves on ``host:port`` (the SuperLink, the gate in front of it)."""

    host: str
    port: int

    @property
    def address(self) -> str:
        """``HOST:PORT`` that SuperNodes and the CLI dial on this machine (loopback when listening on all)."""
        return join_address(dial_host(self.host), self.port)
