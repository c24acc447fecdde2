"""Every method and wrapper of the papers runs end to end through `gastric-fl train`, and settings that cannot
work stop with one line (exit 2) before a run directory exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.checks import every
from support.cli import run_cli
from support.tiny_dataset import TINY_SETTINGS


def _sets(*settings: str) -> list[str]:
    return [x for s in [*TINY_SETTINGS, "run.rounds=1", *settings] for x in ("--set", s)]


@pytest.mark.parametrize(
    "settings",
    [
        ("strategy.name=depthwise_fim",),
        ("strategy.name=depthwise_fim", "depthwise_fim.reverse=true"),
        ("strategy.name=fedavg", "strategy.wrap=fedlws"),
        ("strategy.name=fedprox", "strategy.wrap=fedtlu"),
        ("strategy.name=fedrep", "strategy.wrap=fedlws,fedtlu"),
        ("strategy.name=fedbn",),
        ("strategy.name=fedas", "fedsaf.fisher_estimator=full_pass"),
        ("strategy.name=precision_weighted", "client.optimizer=adam", "client.lr=0.001"),
        ("strategy.name=fedsaf", "strategy.bn=local_stats", "client.start=own"),
    ],
)
def test_each_new_method_trains_end_to_end(
    dataset: Path, tmp_path: Path, settings: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run), "-q", *_sets(*settings)) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_a_timm_architecture_trains_end_to_end(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.name = "timm/<name>"`` (models.names) passes the configuration and federates: FedSAF keeps the last
    two of timm's block groups at each hospital."""
    run = tmp_path / "run"
    settings = _sets("model.name=timm/mobilenetv3_small_050", "strategy.name=fedsaf", "strategy.nhead=2")
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run), "-q", *settings) == 0
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    assert every(line["values_sent"] > 0 for line in lines)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (("strategy.name=fedavg", "fedlws.beta=0"), "fedlws.beta = 0.0 is out of range"),
        (("strategy.name=fedavg", "fedtlu.portion=1.5"), "fedtlu.portion = 1.5 is out of range"),
        (("strategy.name=fedsaf", "strategy.wrap=fedlws"), "strategy.wrap"),
        (("strategy.name=fedavg", "adam.beta1=0.5"), "adam.beta1 = 0.5"),
        (("strategy.name=precision_weighted",), "client.optimizer = adam"),
        (("strategy.name=fedavg", "client.start=own"), "client.start = 'own'"),
        (("strategy.name=fedavg", "strategy.bn=per_client"), "strategy.bn = 'per_client'"),
    ],
)
def test_settings_that_cannot_work_are_one_line(
    dataset: Path,
    tmp_path: Path,
    settings: tuple[str, ...],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run), "-q", *_sets(*settings)) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert message in errors[0]
    assert not run.exists()
