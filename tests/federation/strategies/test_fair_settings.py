"""Settings every method shares (issue: "fair settings"): where BatchNorm lives, where a hospital starts its
round, the Fisher estimator, head-phase BatchNorm, FedAMP's own distance; and the fedbn / fedas methods."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support.checks import every
from support.tiny_dataset import TINY_SETTINGS
from torch import nn

from federation.config import load_config
from federation.errors import FederationError
from federation.hospital.fisher import batch_gradient_trace
from federation.hospital.trainer import Trainer
from federation.launch import train
from federation.server.audit import AUDIT_FILE
from models import batchnorm_keys, create_model

MODEL = create_model("mobilenet_v3_small")
BN_STATS = set(batchnorm_keys(MODEL, affine=False))
BN_ALL = set(batchnorm_keys(MODEL, affine=True))


def _run(dataset: Path, run: Path, *settings: str) -> list[dict[str, Any]]:
    config = load_config(None, [*TINY_SETTINGS, "run.audit=true", *settings], data=dataset)
    train(config, run, progress=False)
    return [json.loads(x) for x in (run / AUDIT_FILE).read_text().splitlines()]


def _keys(lines: list[dict[str, Any]], kind: str, prefix: str = "shared/") -> set[str]:
    return {n.removeprefix(prefix) for x in lines if x["kind"] == kind for n in x["tensors"] if n.startswith(prefix)}


@pytest.mark.parametrize(
    ("settings", "kept"),
    [
        (("strategy.name=fedavg", "strategy.bn=local_stats"), BN_STATS),
        (("strategy.name=fedavg", "strategy.bn=local"), BN_ALL),
        (("strategy.name=fedbn",), BN_ALL),  # FedBN keeps BatchNorm local whatever strategy.bn says
        (("strategy.name=fedsaf", "strategy.bn=local_stats"), BN_STATS),
    ],
)
def test_batchnorm_kept_at_the_hospital_never_travels(
    dataset: Path, tmp_path: Path, settings: tuple[str, ...], kept: set[str]
) -> None:
    lines = _run(dataset, tmp_path / "run", "run.rounds=1", *settings)
    uploaded = _keys(lines, "train_reply")
    assert uploaded
    assert not uploaded & kept
    # each hospital keeps BatchNorm statistics of its own
    states = [load_file(str(tmp_path / "run" / "hospitals" / f"client_{c:02d}" / "model.safetensors")) for c in (0, 2)]
    assert not torch.equal(states[0]["features.0.1.running_mean"], states[1]["features.0.1.running_mean"])


def test_start_own_sends_only_the_centre_and_trains_on(dataset: Path, tmp_path: Path) -> None:
    own = _run(dataset, tmp_path / "own", "run.rounds=2", "strategy.name=fedamp", "client.start=own")
    centre = _run(dataset, tmp_path / "centre", "run.rounds=2", "strategy.name=fedamp")
    assert _keys(own, "train") == set()  # nothing to load: the hospital keeps its own model
    assert _keys(own, "train", "centre/")  # only the centre it is pulled toward
    assert _keys(centre, "train")
    assert not _keys(centre, "train", "centre/")

    def sent(run: str) -> list[int]:
        return [json.loads(x)["values_sent"] for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert sent("own") == sent("centre")  # the same values travel, only their meaning differs

    def losses(run: str) -> list[float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["train_loss"] for x in lines if json.loads(x)["round"] == 2]

    assert losses("own") != losses("centre")


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox", "fedrep", "separate"])
def test_start_own_without_a_personal_centre_is_refused(strategy: str) -> None:
    with pytest.raises(FederationError, match=r"client\.start = 'own'.*use client\.start = centre"):
        load_config(None, [f"strategy.name={strategy}", "client.start=own"])


def test_fedamp_uses_its_own_squared_l2_distance(dataset: Path, tmp_path: Path) -> None:
    _run(dataset, tmp_path / "amp", "run.rounds=2", "strategy.name=fedamp")
    records = [json.loads(x) for x in (tmp_path / "amp" / "aggregation.jsonl").read_text().splitlines()]
    assert {r["dm"] for r in records} == {"euclidean"}


def test_full_pass_fisher_is_the_sum_of_squared_batch_mean_gradients() -> None:
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    batches = [
        (torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])),
        (torch.tensor([[2.0, 2.0]]), torch.tensor([1])),
    ]
    # zero weights: softmax 1/2 each, per-sample gradient (p - onehot(y)) x^T and (p - onehot(y)) for the bias.
    # batch 1 mean: W [[-0.25, 0.5], [0.25, -0.5]], b [0, 0] -> 0.625; batch 2: W [[1, 1], [-1, -1]],
    # b [0.5, -0.5] -> 4.5; total 5.125
    assert batch_gradient_trace(model, ["weight", "bias"], batches) == pytest.approx(5.125, abs=1e-12)
    assert batch_gradient_trace(model, ["bias"], batches) == pytest.approx(0.5, abs=1e-12)


def test_fedas_weights_hospitals_by_their_full_pass_fisher_traces(dataset: Path, tmp_path: Path) -> None:
    _run(dataset, tmp_path / "fedas", "run.rounds=1", "strategy.name=fedas", "fedsaf.fisher_estimator=full_pass")
    record = json.loads((tmp_path / "fedas" / "aggregation.jsonl").read_text().splitlines()[0])
    traces = record["fisher_traces"]
    assert len(traces) == 3
    assert every(t > 0 for t in traces)
    assert [record["weights"][str(c)] for c in (0, 1, 2)] == pytest.approx([t / sum(traces) for t in traces])


def test_head_phase_normalises_with_the_hospitals_own_statistics(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    original_phase = Trainer._phase
    original_recompute = Trainer.recompute_batchnorm

    def phase(self: Trainer, names: Any, *args: Any, **kwargs: Any) -> None:
        calls.append("head" if set(names) == set(self.head_params) else "base")
        original_phase(self, names, *args, **kwargs)

    def recompute(self: Trainer, keep: Collection[str] = ()) -> None:
        if not keep:  # the recipe's; evaluating received weights keeps the statistics that came with them
            calls.append("bn")
        original_recompute(self, keep)

    monkeypatch.setattr(Trainer, "_phase", phase)
    monkeypatch.setattr(Trainer, "recompute_batchnorm", recompute)
    settings = [*TINY_SETTINGS, "run.rounds=1", "strategy.name=fedrep", "strategy.clients=[0]"]
    train(load_config(None, settings, data=dataset), tmp_path / "run", progress=False)
    # statistics recomputed on the hospital's tiles before the head trains on the frozen base, and after the base
    assert calls == ["bn", "head", "base", "bn"]
