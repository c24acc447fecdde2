"""A hospital restarted while the SuperLink still counts it online (issue 34, item 6): ``federation hospital`` says
so and starts again by itself, for a bounded time, instead of exiting with a message that blames its key."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from app.cmd_federation import serve_node
from federation.errors import FederationError
from federation.flower.executor import REFUSED_EXIT
from federation.flower.managed_process import ManagedProcess


def _node(tmp_path: Path, code: int) -> ManagedProcess:
    """A stand-in for the executor: exits at once with ``code`` (``REFUSED_EXIT``: the SuperLink refused it)."""
    argv = [sys.executable, "-c", f"import sys; sys.exit({code})"]
    return ManagedProcess("supernode", argv, log_path=tmp_path / "node.log", env=dict(os.environ), cwd=tmp_path)


def _starts(tmp_path: Path) -> int:
    return sum(1 for line in (tmp_path / "node.log").read_text().splitlines() if line.startswith("--- "))


def test_a_refused_hospital_starts_again_then_names_both_causes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(FederationError) as refused:
        serve_node(_node(tmp_path, REFUSED_EXIT), retry_for=0.5, pause=0.2)
    assert _starts(tmp_path) >= 2  # it tried again by itself
    said = capsys.readouterr().err
    assert "it may still count an earlier start of it online" in said
    assert "trying again in 0.2 s" in said
    assert str(refused.value).startswith("the SuperLink refused this hospital for 0.5 s: its key is not registered")


def test_any_other_stop_is_not_retried(tmp_path: Path) -> None:
    with pytest.raises(FederationError, match="the SuperNode stopped; last lines of"):
        serve_node(_node(tmp_path, 1), retry_for=30.0, pause=0.2)
    assert _starts(tmp_path) == 1


def test_the_executor_tells_a_refusal_by_its_exit_code(tmp_path: Path) -> None:
    """The executor relays its SuperNode's output; Flower's refusal line makes it exit ``REFUSED_EXIT`` (what
    ``serve_node`` retries on), whatever Flower's own exit code (any other exit passes through as it is)."""
    import subprocess

    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    refused_node = [sys.executable, "-c", "print('ERROR : Failed to activate SuperNode'); raise SystemExit(49)"]
    executor = [sys.executable, "-m", "federation.flower.executor", "--runtime", "127.0.0.1:1", "--secret-file"]
    done = subprocess.run([*executor, str(secret), "--", *refused_node], capture_output=True, timeout=120, check=False)
    assert done.returncode == REFUSED_EXIT
    assert b"it still counts an earlier start of this hospital online" in done.stderr


def test_while_the_node_runs_the_hospital_does_its_own_work_between_polls(tmp_path: Path) -> None:
    """``between`` (the hospital scoring its finished runs' test slides) is called every ``every`` seconds while
    the SuperNode runs, and not once it has stopped."""
    argv = [sys.executable, "-c", "import time; time.sleep(2.5)"]
    node = ManagedProcess("supernode", argv, log_path=tmp_path / "node.log", env=dict(os.environ), cwd=tmp_path)
    calls: list[float] = []
    with pytest.raises(FederationError, match="the SuperNode stopped"):
        serve_node(node, retry_for=0.0, pause=0.2, between=lambda: calls.append(1.0), every=0.5)
    assert 2 <= len(calls) <= 6  # about every 0.5 s of the node's 2.5 s
