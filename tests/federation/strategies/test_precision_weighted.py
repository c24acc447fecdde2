"""Precision-weighted FL (paper 004): the server's Eq. 6 on hand-made replies, the reply field on the wire, and
the settings that cannot work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.tiny_dataset import TINY_SETTINGS, make_dataset

from federation.config import load_config
from federation.errors import FederationError
from federation.launch import train
from federation.server.audit import AUDIT_FILE, check_message
from federation.strategies import StrategyContext
from federation.strategies.context import recipe_from_config
from federation.strategies.precision_weighted import PrecisionWeighted
from federation.wire.contract import TrainReply
from models import create_model

UNITS = (("a", ["a.weight", "a.running_mean"]), ("h", ["h.weight"]))
INITIAL = {"a.weight": torch.zeros(2), "a.running_mean": torch.zeros(1), "h.weight": torch.zeros(1)}
CTX = StrategyContext((0, 1, 2), {0: 1, 1: 1, 2: 2}, tuple(INITIAL), UNITS, INITIAL)


def _reply(c: int, w: list[float], mean: float, v: list[float]) -> TrainReply:
    shared = {"a.weight": torch.tensor(w), "a.running_mean": torch.tensor([mean])}
    return TrainReply(c, shared, CTX.num_examples[c], {"train_loss": 0.1}, second_moments={"a.weight": torch.tensor(v)})


REPLIES = {
    0: _reply(0, [1.0, 4.0], 2.0, [1.0, 0.0]),
    1: _reply(1, [3.0, 8.0], 6.0, [3.0, 0.0]),
    2: _reply(2, [10.0, 2.0], 0.0, [1.0, 0.0]),
}


@pytest.mark.parametrize(("inverse", "first"), [(True, 36 / 7), (False, 4.0)])
def test_eq6_weights_each_value_by_its_precision_and_buffers_by_counts(inverse: bool, first: float) -> None:
    strategy = PrecisionWeighted(
        recipe_from_config(load_config(None, [])), 1, CTX, {"a.weight", "h.weight"}, 1e-7, inverse
    )
    record = strategy.aggregate_train(1, REPLIES)
    merged = strategy.configure_train(2, [0])[0].shared
    assert merged is not None
    # value 0: pi = (1/1, 1/3, 1/1) / (7/3) = 3/7, 1/7, 3/7 -> (3 + 3 + 30) / 7; weighted by v: (1 + 9 + 10) / 5
    assert float(merged["a.weight"][0]) == pytest.approx(first, rel=1e-6)
    # value 1: every client's v is 0, so Eq. 6 falls back to n_k/n = 1/4, 1/4, 1/2: 1 + 2 + 1
    assert float(merged["a.weight"][1]) == pytest.approx(4.0, rel=1e-9)
    # BatchNorm buffer: n_k/n, 0.5 + 1.5 + 0
    assert float(merged["a.running_mean"][0]) == pytest.approx(2.0, rel=1e-9)
    assert record["weights"] == {"0": 0.25, "1": 0.25, "2": 0.5}
    assert "h.weight" not in merged


def test_replies_carry_second_moments_of_shared_parameters_only(tmp_path: Path) -> None:
    run = tmp_path / "pw"
    config = load_config(
        None,
        [
            *TINY_SETTINGS,
            "run.rounds=1",
            "strategy.name=precision_weighted",
            "client.optimizer=adam",
            "client.lr=0.001",
            "run.audit=true",
        ],
        data=make_dataset(tmp_path / "tiny"),
    )
    train(config, run, progress=False)
    model = create_model("mobilenet_v3_small")
    params = {k: v.numel() for k, v in model.named_parameters()}
    state = {k: v.numel() for k, v in model.state_dict().items()}
    lines = [json.loads(x) for x in (run / AUDIT_FILE).read_text().splitlines()]
    replies = [x for x in lines if x["kind"] == "train_reply"]
    assert len(replies) == 3
    for line in replies:
        assert check_message(line, list(state)) == []
        moments = {k.removeprefix("second_moment/") for k in line["tensors"] if k.startswith("second_moment/")}
        assert moments == set(params)  # parameters only: BatchNorm buffers have no second moment
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # the default strategy.bn = "local_stats" keeps BatchNorm buffers home: the parameters and their second moments
    assert {m["values_received"] for m in metrics} == {2 * sum(params.values())}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy.name=precision_weighted"], "set client.optimizer = adam"),
        (["adam.beta2=0.99"], r"adam\.beta2 = 0\.99 .*client\.optimizer = \"adam\""),
        (["precision_weighted.inverse=false"], "strategy.name = precision_weighted"),
        (["client.optimizer=rmsprop"], "use one of sgd, adam"),
    ],
)
def test_settings_that_cannot_work_get_one_line(overrides: list[str], message: str, tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "d")

    def run() -> None:
        config = load_config(None, [*TINY_SETTINGS, "run.rounds=1", *overrides], data=dataset)
        train(config, tmp_path / "run", progress=False)

    with pytest.raises(FederationError, match=message):
        run()
