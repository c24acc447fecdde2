"""`gastric-fl ablate` stopped by Ctrl-C says so in one line (issue 48, part 5): a bare ``KeyboardInterrupt()``
printed "()"; a run stopped inside the grid is named by its own first clause, without its advice to resume one run."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from support.cli import run_cli

from app.cmd_ablate import stopped_words
from federation.engine import RunStopped


def test_ctrl_c_during_ablate_prints_one_line_without_empty_parentheses(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # what Ctrl-C raises: no message at all

    monkeypatch.setattr("federation.ablation.run_plan", interrupted)
    before = signal.getsignal(signal.SIGINT)
    calls: list[tuple[int, object]] = []
    monkeypatch.setattr(signal, "signal", lambda sig, handler: calls.append((sig, handler)))
    code = run_cli(
        monkeypatch, "ablate", "--config", "configs/demo.toml", "--grid", "nhead=0", "--data", str(dataset),
        "--out", str(tmp_path / "abl"), "-q",
    )  # fmt: skip
    assert code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stopped by Ctrl-C; run the same command again to continue"]
    # already stopping: a second Ctrl-C is ignored while the line is printed and the command exits
    assert calls == [(signal.SIGINT, signal.SIG_IGN)]
    assert signal.getsignal(signal.SIGINT) is before  # (recorded, not applied to the test process)


def test_a_run_stopped_inside_the_grid_keeps_its_first_clause_only() -> None:
    stopped = RunStopped("stopped after round 3; continue with: gastric-fl train --resume runs/x")
    assert stopped_words(stopped) == "stopped after round 3"
    assert stopped_words(KeyboardInterrupt("stopped by SIGTERM")) == "stopped by SIGTERM"
    assert stopped_words(KeyboardInterrupt("interrupted")) == "stopped (interrupted)"
    assert stopped_words(KeyboardInterrupt()) == "stopped by Ctrl-C"
