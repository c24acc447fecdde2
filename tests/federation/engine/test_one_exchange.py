"""One message per round for the averaging family (issue 21): round r's evaluation rides with round r+1's training.

The proof is a comparison that changes one thing: the same run with the evaluation asked for in a message of its
own (``evaluates_next_start`` switched off) writes the same ``metrics.jsonl`` and ``aggregation.jsonl`` (wall
times aside), also when a hospital's training fails, when the run is interrupted while a round's evaluation is still
to come, and after a resume.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from support.runs import stable
from support.tiny_dataset import TINY_SETTINGS

from federation.config import RunConfig, config_to_toml, load_config
from federation.engine import RunStopped, load_run_config
from federation.errors import FederationError
from federation.hospital.handler import Hospital, Site
from federation.hospital.policy import agreed_shared_keys
from federation.hospital.trainer import Trainer
from federation.launch import train
from federation.runs import read_checkpoint
from federation.server import loop
from federation.server.audit import check_message, describe
from federation.server.pool import Pool
from federation.strategies.fedavg import Averaging
from federation.wire.codec import decode, encode
from federation.wire.contract import (
    EvaluateReply,
    Failure,
    Hello,
    HelloReply,
    Recipe,
    TrainInstruction,
    TrainReply,
    TrainTask,
)
from models import create_model


def _config(dataset: Path, *extra: str) -> RunConfig:
    return load_config(None, [*TINY_SETTINGS, *extra], data=dataset)


def _same_files(a: Path, b: Path) -> None:
    for name in ("metrics.jsonl", "aggregation.jsonl"):
        assert stable(a, name) == stable(b, name), name


def _separate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference: every evaluation in a message of its own, as before issue 21."""
    monkeypatch.setattr(Averaging, "evaluates_next_start", False)


def _count_messages(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    kinds: Counter[str] = Counter()
    original = Pool.exchange

    def counting(self: Pool, tasks: Any) -> Any:
        for task in tasks.values():
            kinds["train" if isinstance(task, TrainTask) else "evaluate"] += 1
            kinds["combined"] += int(isinstance(task, TrainTask) and task.evaluate_previous)
        kinds["exchanges"] += 1
        return original(self, tasks)

    monkeypatch.setattr(Pool, "exchange", counting)
    return kinds


@pytest.mark.parametrize(
    "settings",
    [
        ("strategy.name=fedavg",),
        ("strategy.name=fedrep", "client.precise_bn=true"),
        ("strategy.name=fedbn",),
        ("strategy.name=fedprox", "strategy.wrap=fedlws"),
    ],
    ids=["fedavg", "fedrep-precise-bn", "fedbn", "fedprox-fedlws"],
)
def test_a_combined_round_writes_what_separate_messages_wrote(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: tuple[str, ...]
) -> None:
    config = _config(dataset, "run.rounds=3", *settings)
    kinds = _count_messages(monkeypatch)
    train(config, tmp_path / "combined", progress=False)
    # 3 training exchanges (rounds 2 and 3 also carry the previous round's evaluation) and one evaluation at the end
    assert kinds == Counter(exchanges=4, train=9, combined=6, evaluate=3)
    kinds.clear()
    _separate(monkeypatch)
    train(config, tmp_path / "separate", progress=False)
    assert kinds == Counter(exchanges=6, train=9, combined=0, evaluate=9)
    _same_files(tmp_path / "combined", tmp_path / "separate")
    for c in range(3):  # the hospital's deployed model and its predictions are the same too
        folder = Path("hospitals") / f"client_{c:02d}"
        assert (tmp_path / "combined" / folder / "predictions.csv").read_bytes() == (
            tmp_path / "separate" / folder / "predictions.csv"
        ).read_bytes()
    summary = json.loads((tmp_path / "combined" / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["final"]["round"] == 3


def test_a_failed_training_keeps_the_previous_rounds_evaluation(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Trainer.train

    def refuse_round_2(self: Trainer, instruction: TrainInstruction, server_round: int, seed: int) -> TrainReply:
        if server_round == 2 and instruction.client == 1:
            raise FederationError("hospital 1: its scanner is offline")
        return original(self, instruction, server_round, seed)

    monkeypatch.setattr(Trainer, "train", refuse_round_2)
    config = _config(dataset, "run.rounds=3", "strategy.name=fedavg")
    kinds = _count_messages(monkeypatch)
    train(config, tmp_path / "combined", progress=False)
    # hospital 1's combined message of round 2 failed: round 1's evaluation was asked for on its own
    assert kinds == Counter(exchanges=5, train=9, combined=6, evaluate=4)
    _separate(monkeypatch)
    train(config, tmp_path / "separate", progress=False)
    _same_files(tmp_path / "combined", tmp_path / "separate")
    metrics = stable(tmp_path / "combined", "metrics.jsonl")
    assert [(r["round"], r["client"]) for r in metrics] == [(r, c) for r in (1, 2, 3) for c in (0, 1, 2)]
    assert [r["trained"] for r in metrics if r["client"] == 1] == [True, False, True]
    aggregation = stable(tmp_path / "combined", "aggregation.jsonl")
    assert [a.get("left_out") for a in aggregation] == [None, {"1": "hospital 1: its scanner is offline"}, None]


def test_a_run_stopped_before_a_rounds_evaluation_resumes_to_the_same_files(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(dataset, "run.rounds=3", "strategy.name=fedprox")
    train(config, tmp_path / "reference", progress=False)
    original_round, original_finish = loop.Server._round, loop.Server._finish
    calls = {"round": 0, "finish": 0}

    def stop_before_round_3(self: loop.Server, pool: Pool, server_round: int) -> None:
        calls["round"] += 1
        if server_round == 3 and calls["round"] == 3:
            raise KeyboardInterrupt
        original_round(self, pool, server_round)

    def stop_before_the_last_evaluation(self: loop.Server, pool: Pool) -> None:
        calls["finish"] += 1
        if calls["finish"] == 1:
            raise KeyboardInterrupt
        original_finish(self, pool)

    monkeypatch.setattr(loop.Server, "_round", stop_before_round_3)
    monkeypatch.setattr(loop.Server, "_finish", stop_before_the_last_evaluation)
    run_dir = tmp_path / "stopped"
    with pytest.raises(RunStopped, match="stopped after round 2"):
        train(config, run_dir, progress=False)
    # round 2 is trained and checkpointed; its evaluation had not come: its record waits in the checkpoint
    assert [r["round"] for r in stable(run_dir, "aggregation.jsonl")] == [1]
    pending = read_checkpoint(run_dir, 2).pending
    assert pending is not None
    assert pending["round"] == 2
    assert sorted(pending["trained"]) == ["0", "1", "2"]
    with pytest.raises(RunStopped, match="stopped after round 3"):  # now stopped before round 3's evaluation
        train(load_run_config(run_dir), run_dir, resume=True, progress=False)
    assert [r["round"] for r in stable(run_dir, "aggregation.jsonl")] == [1, 2]
    summary = train(load_run_config(run_dir), run_dir, resume=True, progress=False)
    assert summary["status"] == "finished"
    assert summary["rounds_done"] == 3
    assert summary["final"] == json.loads((tmp_path / "reference" / "summary.json").read_text())["final"]
    _same_files(run_dir, tmp_path / "reference")


def test_a_hospital_asked_for_the_previous_evaluation_needs_a_shared_part(dataset: Path, tmp_path: Path) -> None:
    config = _config(dataset, "run.rounds=2", "strategy.name=fedavg")
    hospital = Hospital(Site(dataset, 0, tmp_path / "h0"))
    assert isinstance(decode(hospital.answer(encode(Hello("run-x", config_to_toml(config))))), HelloReply)
    keys = agreed_shared_keys(config, create_model(config.model.name, 2, config.model.in_chans))
    task = TrainTask("run-x", 2, 7, keys, TrainInstruction(client=0, recipe=Recipe()), evaluate_previous=True)
    reply = decode(hospital.answer(encode(task)))
    assert isinstance(reply, Failure)
    assert "asked to evaluate round 1's model with the shared part sent, but no shared part came" in reply.reason


def test_the_combined_fields_travel_and_may_leave_a_hospital() -> None:
    shared = {"w": torch.ones(2)}
    task = TrainTask("r", 2, 5, ["w"], TrainInstruction(client=1, recipe=Recipe(), shared=shared), False, True)
    decoded = decode(encode(task))
    assert isinstance(decoded, TrainTask)
    assert decoded.evaluate_previous is True
    plain = TrainTask("r", 2, 5, ["w"], TrainInstruction(client=1, recipe=Recipe(), shared=shared))
    assert "evaluate_previous" not in encode(plain)[0]  # other messages' envelopes are as they were
    previous = EvaluateReply(1, 4, {"loss": 0.5, "acc": 0.75, "auc": None}, 0.1)
    reply = TrainReply(1, {"w": torch.zeros(2)}, 8, {"train_loss": 0.3}, 1.0, {}, None, previous)
    back = decode(encode(reply))
    assert isinstance(back, TrainReply)
    assert back.previous == previous
    assert back.evaluation is None
    assert check_message(describe("from_hospital", encode(reply)), ["w"]) == []
    assert "previous" not in encode(TrainReply(1, {"w": torch.zeros(2)}, 8, {"train_loss": 0.3}))[0]
