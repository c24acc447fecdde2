"""`gastric-fl train` and `gastric-fl report` as a user (or the dashboard) runs them: exit codes and messages."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import run_cli
from support.tiny_dataset import TINY_SETTINGS

from federation.server import loop

TINY = [arg for setting in TINY_SETTINGS for arg in ("--set", setting)]


def test_train_then_report(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    code = run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run_dir), "-q", *TINY)
    out = capsys.readouterr()
    assert code == 0
    assert "finished 2 rounds: averaged test accuracy" in out.out
    assert f"run directory: {run_dir}" in out.err
    assert run_cli(monkeypatch, "report", str(run_dir)) == 0
    printed = capsys.readouterr().out
    assert "| run | strategy |" in printed
    assert "| run | hospital | num_train | num_test | test_acc | test_auc |" in printed
    for name in ("report.md", "report.csv", "hospitals.csv", "accuracy.png"):
        assert (run_dir / name).is_file()
    # each hospital's verdict, as the Verdict page gives it with the same floor, named in the report
    from app.evaluation.verdict import Floor
    from app.verdicts import judge_run

    expected = judge_run(run_dir, Floor()).judgements
    assert len(expected) >= 2
    assert (
        "| run | hospital | verdict | threshold | threshold from | unfamiliar slides | focus slides (review) | reason |"
        in printed
    )
    for judged in expected:
        assert f"| {judged.hospital} | {judged.verdict.kind.upper()} | 0.5000 |" in printed
        assert judged.verdict.reason in printed
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert f"Against the floor: {Floor().words}." in report
    # the CSV keeps the field names other tools read
    assert (run_dir / "hospitals.csv").read_text().splitlines()[0].startswith("run,client,")
    assert run_cli(monkeypatch, "report", str(run_dir), "--floor", "0.5", "--min-slides", "1") == 0
    capsys.readouterr()
    looser = Floor(0.5, 1)
    assert f"Against the floor: {looser.words}." in (run_dir / "report.md").read_text(encoding="utf-8")
    assert run_cli(monkeypatch, "report", str(run_dir), "--floor", "1.5") == 2
    assert "--floor/--min-slides/--review-specificity" in capsys.readouterr().err
    # the same directory again needs --overwrite: one line, exit 2
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run_dir), *TINY) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: run directory {run_dir} already exists: pass --overwrite to replace it, "
        f"or --resume {run_dir} to continue it"
    )


def test_bad_settings_are_one_line_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(monkeypatch, "train", "--set", "client.lr=-1", "--print-config") == 2
    assert capsys.readouterr().err.strip() == "error: config client.lr = -1.0 is out of range: use a finite value > 0"
    assert run_cli(monkeypatch, "train", "--set", "strategy.nheads=2", "--print-config") == 2
    assert "unknown key strategy.nheads" in capsys.readouterr().err
    assert run_cli(monkeypatch, "report") == 2
    assert "give at least one run directory" in capsys.readouterr().err


def test_print_config_shows_the_resolved_strategy_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(monkeypatch, "train", "--set", "strategy.name=fedrep", "--print-config") == 0
    text = capsys.readouterr().out
    assert 'name = "fedrep"' in text
    assert "nhead = 1" in text
    assert "head_lr = 0.01" in text


def test_interrupted_run_exits_130_and_resumes(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(self: loop.Server, pool: object, server_round: int) -> None:
        raise KeyboardInterrupt

    run_dir = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr(loop.Server, "_round", interrupted)
        code = run_cli(
            patch, "train", "--data", str(dataset), "--out", str(run_dir), "-q", "--set", "run.rounds=1", *TINY
        )
    assert code == 130
    assert f"continue with: gastric-fl train --resume {run_dir}" in capsys.readouterr().err
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "--set", "client.lr=0.5") == 2
    assert "a resumed run keeps its configuration" in capsys.readouterr().err
    assert run_cli(monkeypatch, "train", "--resume", str(run_dir), "-q") == 0


def test_transmitted_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(monkeypatch, "report", "--transmitted", "mobilenet_v3_small") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| model | nhead | shared_units | state_dict_values | parameters |"
    assert lines[-1] == "| mobilenet_v3_small | 12 | 3 | 5,510 | 5,072 |"
