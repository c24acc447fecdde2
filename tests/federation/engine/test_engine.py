"""The round loop end to end on a tiny dataset: determinism, resume, run directory, FedRep heads, failures."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support.checks import every
from support.runs import stable
from support.tiny_dataset import LAYOUT, TINY_SETTINGS

from federation.config import RunConfig, load_config
from federation.engine import RunStopped, load_run_config
from federation.errors import FederationError
from federation.hospital.trainer import Trainer
from federation.launch import train
from federation.provenance import code_version, machine
from federation.runs import complete_checkpoints
from federation.server import loop
from models import ModelError, base_keys, create_model, head_keys, split_units


def _config(dataset: Path, *extra: str) -> RunConfig:
    return load_config(None, [*TINY_SETTINGS, *extra], data=dataset)


@pytest.fixture(scope="module")
def reference(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 3-round FedProx run (augmentation on, keep 2 checkpoints)."""
    run_dir = tmp_path_factory.mktemp("runs") / "reference"
    train(_config(dataset, "run.rounds=3", "strategy.name=fedprox"), run_dir, progress=False)
    return run_dir


def test_same_seed_and_config_give_identical_metrics(dataset: Path, reference: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    train(_config(dataset, "run.rounds=3", "strategy.name=fedprox"), again, progress=False)
    assert stable(again) == stable(reference)
    other_seed = tmp_path / "other"
    train(_config(dataset, "run.rounds=1", "strategy.name=fedprox", "run.seed=1"), other_seed, progress=False)
    assert stable(other_seed)[0]["train_loss"] != stable(reference)[0]["train_loss"]


def test_resumed_run_ends_with_the_same_metrics(dataset: Path, reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "resumed"
    train(_config(dataset, "run.rounds=2", "strategy.name=fedprox"), run_dir, progress=False)
    # a crash in the middle of round 3 may leave a partial record behind: resume must redo that round
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"round": 3, "client": 0, "train_loss": 9.9, "test_acc": 0.0}) + "\n")
    summary = train(load_run_config(run_dir, ["run.rounds=3"]), run_dir, resume=True, progress=False)
    assert summary["status"] == "finished"
    assert summary["rounds_done"] == 3
    assert stable(run_dir) == stable(reference)
    ref = load_file(str(reference / "checkpoints" / "round_0003.safetensors"))
    res = load_file(str(run_dir / "checkpoints" / "round_0003.safetensors"))
    assert ref.keys() == res.keys()
    assert every(torch.equal(ref[k], res[k]) for k in ref)


def test_run_directory_contents(reference: Path) -> None:
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["rounds_done"] == summary["total_rounds"] == 3
    assert summary["eta_seconds"] == 0
    assert summary["error"] is None
    assert summary["clients"] == [0, 1, 2]
    assert summary["final"]["round"] == 3
    assert summary["best"]["round"] in (1, 2, 3)
    assert summary["code_versions"] == [code_version()]  # the commit that trained it, for published tables
    assert summary["machines"] == [machine("cpu")]  # and the machine (no host name: a summary may be published)
    assert socket.gethostname() not in summary["machines"][0]
    metrics = stable(reference)
    assert len(metrics) == 3 * 3
    # the default strategy.bn = "local_stats" keeps BatchNorm running statistics at the hospital: parameters travel
    shared_values = sum(v.numel() for v in create_model("mobilenet_v3_small").parameters())
    for record in metrics:
        assert record["values_sent"] == record["values_received"] == shared_values  # FedProx: centre counted once
        assert record["num_train"] == sum(LAYOUT[record["client"]]["train"])
        assert record["fisher_trace"] is None
    assert [r["test_auc"] is None for r in metrics if r["round"] == 3] == [False, True, False]
    aggregation = [json.loads(line) for line in (reference / "aggregation.jsonl").read_text().splitlines()]
    assert [a["round"] for a in aggregation] == [1, 2, 3]
    assert aggregation[0]["values_sent"] == 3 * shared_values
    assert aggregation[0]["weights"] == pytest.approx({"0": 10 / 22, "1": 7 / 22, "2": 5 / 22})
    predictions = []
    for c in (0, 1, 2):
        with (reference / "hospitals" / f"client_{c:02d}" / "predictions.csv").open() as handle:
            predictions += list(csv.DictReader(handle))
    assert not (reference / "predictions.csv").exists()  # per-tile results stay with each hospital
    assert len(predictions) == sum(sum(s["test"]) for s in LAYOUT.values())
    assert {p["round"] for p in predictions} == {"3"}
    assert every(0.0 <= float(p["prob_abnormal"]) <= 1.0 for p in predictions)
    assert {p["label"] for p in predictions if p["client"] == "1"} == {"abnormal"}
    assert complete_checkpoints(reference) == [2, 3]  # keep_checkpoints = 2
    resolved = load_config(reference / "config.toml")
    assert resolved.strategy.nhead == 0
    assert resolved.client.head_lr == resolved.client.lr


def test_fedrep_head_of_a_client_is_never_changed_by_the_others(dataset: Path, tmp_path: Path) -> None:
    # Round 1 trains each head from the common initial model on the client's own tiles before the base; so a
    # client's head after round 1 must be bit-identical whether or not other hospitals take part.
    together, alone = tmp_path / "together", tmp_path / "alone"
    train(_config(dataset, "run.rounds=1", "strategy.name=fedrep"), together, progress=False)
    train(_config(dataset, "run.rounds=1", "strategy.name=fedrep", "strategy.clients=[0]"), alone, progress=False)
    head = head_keys(split_units(create_model("mobilenet_v3_small")), 1)

    def hospital(run: Path, c: int) -> dict[str, torch.Tensor]:
        return load_file(str(run / "hospitals" / f"client_{c:02d}" / "checkpoints" / "round_0001.safetensors"))

    a0, a1, a2, b0 = hospital(together, 0), hospital(together, 1), hospital(together, 2), hospital(alone, 0)
    assert len(head) == 2  # the classifier's last linear layer: weight and bias
    assert every(torch.equal(a0[k], b0[k]) for k in head)
    # and each hospital keeps a head of its own while the base is common after the round
    assert not torch.equal(a0["classifier.3.weight"], a1["classifier.3.weight"])
    base = base_keys(split_units(create_model("mobilenet_v3_small")), 1)
    # (the default strategy.bn = "local_stats" keeps the base's BatchNorm running statistics at each hospital)
    travelling = [k for k in base if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    means = [k for k in base if k.endswith("running_mean")]
    assert len(travelling) > 100
    assert len(means) > 10
    assert every(torch.equal(a0[k], a2[k]) for k in travelling)
    assert not all(torch.equal(a0[k], a2[k]) for k in means)
    # the server's checkpoint holds the shared base only: no head tensor of any hospital
    server = load_file(str(together / "checkpoints" / "round_0001.safetensors"))
    assert server
    assert not any(k.endswith(tuple(head)) for k in server)
    metrics = stable(together)
    shared = sum(v.numel() for k, v in create_model("mobilenet_v3_small").state_dict().items() if k in travelling)
    assert [(r["round"], r["client"]) for r in metrics] == [(1, 0), (1, 1), (1, 2)]
    assert every(r["values_sent"] == r["values_received"] == shared for r in metrics)


def test_separate_sends_nothing_in_a_run(dataset: Path, tmp_path: Path) -> None:
    train(_config(dataset, "run.rounds=1", "strategy.name=separate"), tmp_path / "sep", progress=False)
    metrics = stable(tmp_path / "sep")
    assert [(r["round"], r["client"]) for r in metrics] == [(1, 0), (1, 1), (1, 2)]
    assert every(r["values_sent"] == r["values_received"] == 0 for r in metrics)


def test_failure_is_recorded_in_the_summary(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Trainer) -> None:
        raise FederationError(f"client {self.hospital}: test split unreadable")

    monkeypatch.setattr(Trainer, "evaluate", broken)
    with pytest.raises(FederationError, match="test split unreadable"):
        train(_config(dataset, "run.rounds=1"), tmp_path / "failed", progress=False)
    summary = json.loads((tmp_path / "failed" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"].startswith("round 1: no hospital could evaluate (hospital 0: evaluation: client 0: test")


def test_interrupt_marks_the_run_stopped_and_it_can_resume(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = loop.Server._round
    calls = {"n": 0}

    def interrupt_second(self: loop.Server, pool: Any, server_round: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        original(self, pool, server_round)

    monkeypatch.setattr(loop.Server, "_round", interrupt_second)
    run_dir = tmp_path / "stopped"
    with pytest.raises(RunStopped, match=rf"stopped after round 1; continue with: gastric-fl train --resume {run_dir}"):
        train(_config(dataset, "run.rounds=2", "strategy.name=separate"), run_dir, progress=False)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
    summary = train(load_run_config(run_dir), run_dir, resume=True, progress=False)
    assert summary["status"] == "finished"
    assert [r["round"] for r in stable(run_dir)] == [1, 1, 1, 2, 2, 2]


def test_existing_run_directory_needs_overwrite_and_resume_keeps_its_config(dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(_config(dataset, "run.rounds=1", "strategy.name=separate"), run_dir, progress=False)
    with pytest.raises(FederationError, match="already exists: pass --overwrite"):
        train(_config(dataset, "run.rounds=1", "strategy.name=separate"), run_dir, progress=False)
    with pytest.raises(
        FederationError,
        match=r"only flower\.connect_timeout, .*run\.device, run\.engine, run\.keep_checkpoints, run\.rounds",
    ):
        load_run_config(run_dir, ["client.lr=0.5"])
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(FederationError, match="was not made by gastric-fl train"):
        train(_config(dataset, "run.rounds=1"), tmp_path / "notes", overwrite=True, progress=False)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_too_small_input_and_bad_nhead_fail_before_training(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="at least 63"):
        train(_config(dataset, "model.name=alexnet"), tmp_path / "a", progress=False)
    with pytest.raises(ModelError, match=r"nhead=16 is out of range.*0\.\.15"):
        train(_config(dataset, "strategy.name=fedrep", "strategy.nhead=16"), tmp_path / "b", progress=False)


def test_worker_processes_give_the_same_results(dataset: Path, reference: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "workers"
    train(_config(dataset, "run.rounds=1", "strategy.name=fedprox", "run.workers=2"), run_dir, progress=False)
    # same seeds and the same thread count (run.threads = 1) in the workers as in this process: identical numbers
    assert stable(run_dir) == [m for m in stable(reference) if m["round"] == 1]


def test_sigterm_marks_the_run_stopped(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the dashboard stops a run by sending SIGTERM to its process
    def terminate(self: loop.Server, pool: Any, server_round: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(loop.Server, "_round", terminate)
    before = signal.getsignal(signal.SIGTERM)
    run_dir = tmp_path / "terminated"
    with pytest.raises(RunStopped):
        train(_config(dataset, "run.rounds=1", "strategy.name=separate"), run_dir, progress=False)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert summary["error"] == "stopped by SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before  # the engine puts the previous handler back
