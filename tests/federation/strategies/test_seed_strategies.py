"""Depth-wise FIM (paper 000) and the FedLWS / FedTLU wrappers (papers 002, 003) at the message level.

Hand-made replies from three unequal clients (1, 2 and 5 training tiles); no training, no engine. Every
expected number is worked out by hand in the comments, or by a few lines of numpy next to it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support.checks import every

from federation.config import RunConfig, config_to_toml, load_config
from federation.errors import FederationError
from federation.strategies import StrategyContext, build_strategy
from federation.strategies.context import recipe_from_config
from federation.strategies.depthwise_fim import DepthwiseFisher
from federation.strategies.fedavg import Averaging
from federation.strategies.wrappers import fedlws, fedtlu
from federation.strategies.wrappers.fedlws import LayerWiseShrinking, module_layers
from federation.strategies.wrappers.fedtlu import TargetedLayerUpdates, body_group, keep_count, shape_groups
from federation.wire.contract import Recipe, Strategy, TrainReply, count_values
from models import create_model, split_units

# A six-unit "model" named like MobileNetV3: a stem with BatchNorm buffers, three body blocks (weight + bias; the
# last with a running mean), a final convolution and a classifier head.
UNITS = (
    ("features.0", ["features.0.weight", "features.0.running_mean", "features.0.num_batches_tracked"]),
    ("features.1", ["features.1.weight", "features.1.bias"]),
    ("features.2", ["features.2.weight", "features.2.bias"]),
    ("features.3", ["features.3.weight", "features.3.bias", "features.3.running_mean"]),
    ("features.4", ["features.4.weight"]),
    ("classifier", ["classifier.weight"]),
)
KEYS = tuple(k for _, keys in UNITS for k in keys)
BUFFERS = {"features.0.running_mean", "features.0.num_batches_tracked", "features.3.running_mean"}
PARAMS = set(KEYS) - BUFFERS
SHARED = [k for k in KEYS if not k.startswith("classifier")]  # nhead = 1


def _state(values: dict[str, list[float] | int]) -> dict[str, torch.Tensor]:
    return {
        k: torch.tensor(v, dtype=torch.int64) if isinstance(v, int) else torch.tensor(v, dtype=torch.float32)
        for k, v in values.items()
    }


INITIAL = _state(
    {
        "features.0.weight": [1, 2],
        "features.0.running_mean": [0, 0],
        "features.0.num_batches_tracked": 0,
        "features.1.weight": [3, 4],
        "features.1.bias": [0, 0],
        "features.2.weight": [0, 0],
        "features.2.bias": [0, 0],
        "features.3.weight": [1, 0],
        "features.3.bias": [0, 1],
        "features.3.running_mean": [0, 0],
        "features.4.weight": [2, 0],
        "classifier.weight": [0, 0],
    }
)
CTX = StrategyContext((0, 1, 2), {0: 1, 1: 2, 2: 5}, KEYS, UNITS, INITIAL)
# FedAvg weights 1/8, 2/8, 5/8.
CLIENT_STATES = {
    0: _state(
        {
            "features.0.weight": [2, 2],
            "features.0.running_mean": [1, 1],
            "features.0.num_batches_tracked": 2,
            "features.1.weight": [3, 5],
            "features.1.bias": [1, 0],
            "features.2.weight": [1, 0],
            "features.2.bias": [0, 0],
            "features.3.weight": [1, 1],
            "features.3.bias": [0, 1],
            "features.3.running_mean": [1, 1],
            "features.4.weight": [2, 1],
        }
    ),
    1: _state(
        {
            "features.0.weight": [1, 3],
            "features.0.running_mean": [2, 0],
            "features.0.num_batches_tracked": 4,
            "features.1.weight": [4, 4],
            "features.1.bias": [0, 1],
            "features.2.weight": [0, 1],
            "features.2.bias": [1, 0],
            "features.3.weight": [2, 0],
            "features.3.bias": [0, 2],
            "features.3.running_mean": [2, 2],
            "features.4.weight": [2, 2],
        }
    ),
    2: _state(
        {
            "features.0.weight": [1, 2],
            "features.0.running_mean": [4, 4],
            "features.0.num_batches_tracked": 8,
            "features.1.weight": [3, 4],
            "features.1.bias": [0, 0],
            "features.2.weight": [0, 0],
            "features.2.bias": [0, 1],
            "features.3.weight": [1, 0],
            "features.3.bias": [1, 0],
            "features.3.running_mean": [4, 0],
            "features.4.weight": [3, 0],
        }
    ),
}
# FedAvg of the shared part, by hand: sum_k n_k/8 * w_k.
FEDAVG = {
    "features.0.weight": [1.125, 2.25],  # (2 + 2 + 5)/8, (2 + 6 + 10)/8
    "features.0.running_mean": [3.125, 2.625],  # (1 + 4 + 20)/8, (1 + 0 + 20)/8
    "features.1.weight": [3.25, 4.125],  # (3 + 8 + 15)/8, (5 + 8 + 20)/8
    "features.1.bias": [0.125, 0.25],
    "features.2.weight": [0.125, 0.25],
    "features.2.bias": [0.25, 0.625],
    "features.3.weight": [1.25, 0.125],
    "features.3.bias": [0.625, 0.625],
    "features.3.running_mean": [3.125, 0.625],  # (1 + 4 + 20)/8, (1 + 4 + 0)/8
    "features.4.weight": [2.625, 0.625],
}


def _replies(traces: dict[int, float] | None = None) -> dict[int, TrainReply]:
    return {
        c: TrainReply(
            c, dict(state), CTX.num_examples[c], {"train_loss": 0.5, **({"fisher_trace": traces[c]} if traces else {})}
        )
        for c, state in CLIENT_STATES.items()
    }


def _config(*overrides: str) -> RunConfig:
    return load_config(None, list(overrides))


def _recipe() -> Recipe:
    return recipe_from_config(_config())


def _fedavg() -> Averaging:
    """FedAvg with a local classifier (nhead 1), the inner strategy of the wrappers' exact tests."""
    return Averaging("fedavg", _recipe(), 1, CTX)


def _global(strategy: Strategy) -> dict[str, torch.Tensor]:
    sent = strategy.configure_train(2, [0])[0].shared
    assert sent is not None
    return sent


# --- FedLWS ---------------------------------------------------------------------------------------------------------


def test_module_layers_keep_weight_and_bias_together() -> None:
    keys = ["a.weight", "a.bias", "b.weight", "c.weight", "c.bias"]
    ordered, names, ranges = module_layers(keys)
    assert ordered == keys
    assert names == ["a", "b", "c"]
    assert ranges == [slice(0, 2), slice(2, 3), slice(3, 5)]


def test_fedlws_shrinks_each_layer_of_the_fedavg_aggregate_exactly() -> None:
    beta = 1.0
    lws = LayerWiseShrinking(_fedavg(), CTX, PARAMS, beta=beta)
    record = lws.aggregate_train(1, _replies())
    assert record["weights"] == {"0": 0.125, "1": 0.25, "2": 0.625}  # the inner record is kept
    log = record["fedlws"]
    assert log["layers"] == ["features.0", "features.1", "features.2", "features.3", "features.4"]
    # features.1 by hand: w = [3, 4 | 0, 0], ||w|| = 5; g_k = [0,1,1,0], [1,0,0,1], [0,0,0,0], mean 1/3 each;
    # distances sqrt(10)/3, sqrt(10)/3, 2/3 -> tau = (2 sqrt 10 + 2)/9 = 0.9249506 (unweighted over clients);
    # w_hat - w = [0.25, 0.125, 0.125, 0.25], norm sqrt(0.15625) = 0.3952847;
    # gamma = 5 / (1 * 0.9249506 * 0.3952847 + 5) = 5 / 5.3656188 = 0.9318590
    assert log["tau"][1] == pytest.approx(0.9249506, abs=1e-7)
    assert log["gamma"][1] == pytest.approx(0.9318590, abs=1e-7)
    # features.2 starts at zero: gamma = 1, the aggregate is kept as it is
    assert log["gamma"][2] == 1.0
    # Every layer from the formula in numpy (weights and biases of one module together, buffers left out).
    layer_keys = [["features.0.weight"], ["features.1.weight", "features.1.bias"]]
    layer_keys += [["features.2.weight", "features.2.bias"], ["features.3.weight", "features.3.bias"]]
    layer_keys += [["features.4.weight"]]
    n = np.array([1.0, 2.0, 5.0])
    expected_gamma = []
    for keys in layer_keys:
        w = np.concatenate([INITIAL[k].numpy() for k in keys]).astype(np.float64)
        wk = np.stack([np.concatenate([CLIENT_STATES[c][k].numpy() for k in keys]) for c in (0, 1, 2)])
        w_hat = (n[:, None] * wk).sum(0) / n.sum()
        g = wk - w
        tau = np.linalg.norm(g - g.mean(0), axis=1).mean()
        norm = np.linalg.norm(w)
        expected_gamma.append(1.0 if norm == 0 else norm / (beta * tau * np.linalg.norm(w_hat - w) + norm))
    assert log["gamma"] == pytest.approx(expected_gamma, abs=1e-12)
    new = _global(lws)
    for keys, gamma in zip(layer_keys, expected_gamma, strict=True):
        for k in keys:
            assert torch.allclose(new[k], torch.tensor(FEDAVG[k]) * gamma, atol=1e-6), k
    # BatchNorm running statistics: the FedAvg average, never shrunk; the counter (2 + 8 + 40)/8 = 6.25 -> 6
    assert torch.equal(new["features.0.running_mean"], torch.tensor(FEDAVG["features.0.running_mean"]))
    assert torch.equal(new["features.3.running_mean"], torch.tensor(FEDAVG["features.3.running_mean"]))
    assert int(new["features.0.num_batches_tracked"]) == 6
    assert "classifier.weight" not in new


def test_fedlws_second_round_starts_from_the_shrunk_model() -> None:
    lws = LayerWiseShrinking(_fedavg(), CTX, PARAMS, beta=1.0)
    lws.aggregate_train(1, _replies())
    shrunk = {k: v.clone() for k, v in _global(lws).items()}
    # Every client returns the shrunk model unchanged: no step, so every gamma is 1 and nothing moves.
    same = {c: TrainReply(c, dict(shrunk), CTX.num_examples[c]) for c in (0, 1, 2)}
    log = lws.aggregate_train(2, same)["fedlws"]
    assert log["gamma"] == [1.0] * 5
    assert every(torch.allclose(_global(lws)[k].double(), shrunk[k].double(), rtol=0, atol=1e-6) for k in SHARED)


# --- FedTLU ---------------------------------------------------------------------------------------------------------


def test_fedtlu_body_keeps_the_best_blocks_and_reverts_the_rest_with_their_buffers() -> None:
    tlu = TargetedLayerUpdates(_fedavg(), CTX, PARAMS, portion=0.5, grouping="body")
    assert tlu.groups == [["features.1", "features.2", "features.3"]]  # not the stem, not the final convolution
    log = tlu.aggregate_train(1, _replies())["fedtlu"]
    # Delta = FedAvg - initial, scores sqrt(1 + mean^2/var) (population std):
    # features.1: w [0.25, 0.125] -> mean 0.1875, std 0.0625 -> sqrt 10; b [0.125, 0.25] -> sqrt 10; mean 3.1622777
    # features.2: w [0.125, 0.25] -> sqrt 10; b [0.25, 0.625] -> mean 0.4375, std 0.1875 -> sqrt(58/9) = 2.5385910;
    #             mean 2.8504343
    # features.3: w [0.25, 0.125] -> sqrt 10; b [0.625, -0.375] -> mean 0.125, std 0.5 -> sqrt(1.0625) = 1.0307764;
    #             mean 2.0965270
    # ceil(0.5 * 3) = 2 blocks updated: features.1 and features.2; features.3 keeps the previous model.
    assert log["scores"]["features.1"] == pytest.approx(math.sqrt(10), abs=1e-6)
    assert log["scores"]["features.2"] == pytest.approx(2.8504343, abs=1e-6)
    assert log["scores"]["features.3"] == pytest.approx(2.0965270, abs=1e-6)
    # features.4: Delta [0.625, 0.625] has std 0 -> +inf, logged as null (JSON has no inf)
    assert log["scores"]["features.4"] is None
    assert log["updated"] == ["features.1", "features.2"]
    assert log["kept_previous"] == ["features.3"]
    new = _global(tlu)
    for k in (
        "features.0.weight",
        "features.0.running_mean",
        "features.1.weight",
        "features.2.bias",
        "features.4.weight",
    ):
        assert torch.equal(new[k], torch.tensor(FEDAVG[k])), k
    for k in ("features.3.weight", "features.3.bias", "features.3.running_mean"):  # the buffer follows its block
        assert torch.equal(new[k], INITIAL[k]), k


def test_fedtlu_portion_decides_how_many_blocks_move() -> None:
    tlu = TargetedLayerUpdates(_fedavg(), CTX, PARAMS, portion=0.3, grouping="body")  # ceil(0.9) = 1
    log = tlu.aggregate_train(1, _replies())["fedtlu"]
    assert log["updated"] == ["features.1"]
    assert log["kept_previous"] == ["features.2", "features.3"]
    full = TargetedLayerUpdates(_fedavg(), CTX, PARAMS, portion=1.0, grouping="body")
    assert full.aggregate_train(1, _replies())["fedtlu"]["kept_previous"] == []
    assert every(torch.equal(_global(full)[k], torch.tensor(FEDAVG[k])) for k in FEDAVG)


def test_fedtlu_shapes_groups_identical_blocks_as_in_the_paper() -> None:
    tlu = TargetedLayerUpdates(_fedavg(), CTX, PARAMS, portion=0.5, grouping="shapes")
    # Parameter shapes: features.0 and .4 ((2,)), features.1-3 ((2,), (2,)); buffers do not count.
    assert tlu.groups == [["features.0", "features.4"], ["features.1", "features.2", "features.3"]]
    log = tlu.aggregate_train(1, _replies())["fedtlu"]
    # features.0: Delta [0.125, 0.25] -> sqrt 10 < features.4's +inf: ceil(0.5 * 2) = 1, the stem keeps w^t,
    # and its BatchNorm statistics with it.
    assert log["updated"] == ["features.1", "features.2", "features.4"]
    assert log["kept_previous"] == ["features.0", "features.3"]
    new = _global(tlu)
    assert torch.equal(new["features.0.running_mean"], INITIAL["features.0.running_mean"])
    assert int(new["features.0.num_batches_tracked"]) == 0


def test_fedtlu_keep_count_and_groups() -> None:
    assert [keep_count(p, 10) for p in (0.3, 0.25, 0.5, 0.75, 1.0)] == [3, 3, 5, 8, 10]  # 0.3*10 is 3, not 4
    assert keep_count(0.01, 3) == 1
    units = [f"features.{i}" for i in range(13)] + ["classifier.0", "classifier.3"]
    assert body_group(units, units) == [[f"features.{i}" for i in range(1, 12)]]
    resnet = ["conv1", "bn1", "layer1.0", "layer1.1", "layer2.0", "fc"]
    assert body_group(resnet, resnet) == [["layer1.0", "layer1.1", "layer2.0"]]
    assert shape_groups({"a": ((2,),), "b": ((3,),), "c": ((2,),)}) == [["a", "c"]]


def test_fedtlu_body_of_a_timm_model() -> None:
    """A timm architecture's units are timm's block grouping: its body is the blocks, stem and head stay out."""
    from models import create_model, split_units

    names = [name for name, _ in split_units(create_model("timm/mobilenetv3_small_050"))]
    body = [n for n in names if n.startswith("blocks.")]
    assert len(body) == len(names) - 2  # all but the stem and the head
    assert body_group(names, names) == [body]
    convnext = ["stem", "stages.0.blocks.0", "stages.0.blocks.1", "stages.1.downsample", "head"]
    assert body_group(convnext, convnext) == [convnext[1:4]]


def test_fedtlu_with_nothing_to_select_is_refused() -> None:
    ctx = StrategyContext(
        (0,),
        {0: 1},
        ("a.weight", "b.weight"),
        (("a", ["a.weight"]), ("b", ["b.weight"])),
        {
            "a.weight": torch.zeros(2),
            "b.weight": torch.zeros(2),
        },
    )
    inner = Averaging("fedavg", _recipe(), 0, ctx)
    with pytest.raises(FederationError, match="no group of two or more blocks"):
        TargetedLayerUpdates(inner, ctx, {"a.weight", "b.weight"}, portion=0.5, grouping="body")


# --- wrappers: what they ask of clients, the registry and the configuration -----------------------------------------


def _build(*overrides: str) -> Strategy:
    return build_strategy(_config(*overrides), CTX)


@pytest.fixture
def toy_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrappers find trainable parameters by building the configured model; here the toy model's."""
    monkeypatch.setattr(fedlws, "trainable_keys", lambda config: PARAMS)
    monkeypatch.setattr(fedtlu, "trainable_keys", lambda config: PARAMS)


@pytest.mark.usefixtures("toy_parameters")
@pytest.mark.parametrize("wrap", ["fedlws", "fedtlu", "fedlws,fedtlu"])
@pytest.mark.parametrize("inner", ["fedavg", "fedprox", "fedrep", "depthwise_fim"])
def test_wrappers_send_exactly_what_the_inner_strategy_sends(inner: str, wrap: str) -> None:
    plain = _build(f"strategy.name={inner}", "strategy.nhead=1")
    wrapped = _build(f"strategy.name={inner}", "strategy.nhead=1", f"strategy.wrap={wrap}")
    assert wrapped.name == "+".join([inner, *wrap.split(",")])
    assert wrapped.shared_keys(KEYS, [u for _, u in UNITS]) == plain.shared_keys(KEYS, [u for _, u in UNITS]) == SHARED
    a, b = plain.configure_train(1, [0, 1, 2]), wrapped.configure_train(1, [0, 1, 2])
    for c in (0, 1, 2):
        assert a[c].recipe == b[c].recipe
        assert count_values(a[c]) == count_values(b[c]) == sum(INITIAL[k].numel() for k in SHARED)
        assert (a[c].centre is None) == (b[c].centre is None)
        sent_plain, sent_wrapped = a[c].shared, b[c].shared
        assert sent_plain is not None
        assert sent_wrapped is not None
        assert every(torch.equal(sent_plain[k], sent_wrapped[k]) for k in SHARED)
    # After a round: the same recipe and keys still (only the values of the global model differ).
    replies = _replies({0: 4.0, 1: 1.0, 2: 3.0})
    wrapped.aggregate_train(1, replies)
    after = wrapped.configure_train(2, [0, 1, 2])
    assert every(after[c].recipe == a[c].recipe and list(after[c].shared or {}) == SHARED for c in (0, 1, 2))


@pytest.mark.usefixtures("toy_parameters")
def test_wrapped_state_round_trips_through_checkpoints_and_refuses_other_settings() -> None:
    first = _build("strategy.name=fedavg", "strategy.nhead=1", "strategy.wrap=fedlws", "fedlws.beta=0.5")
    first.aggregate_train(1, _replies())
    second = _build("strategy.name=fedavg", "strategy.nhead=1", "strategy.wrap=fedlws", "fedlws.beta=0.5")
    second.load_state_tensors(first.state_tensors())
    second.load_state_json(first.state_json())
    assert every(torch.equal(_global(first)[k], _global(second)[k]) for k in SHARED)
    other = _build("strategy.name=fedavg", "strategy.nhead=1", "strategy.wrap=fedlws", "fedlws.beta=0.1")
    with pytest.raises(FederationError, match="beta"):
        other.load_state_json(first.state_json())


@pytest.mark.parametrize("inner", ["fedamp", "fedsaf", "separate"])
def test_wrapping_a_non_averaging_strategy_is_refused_in_one_line(inner: str) -> None:
    with pytest.raises(FederationError, match=rf"strategy {inner} keeps no averaged global model") as caught:
        _config(f"strategy.name={inner}", "strategy.wrap=fedlws")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fedlws.beta=0", r"fedlws\.beta = 0\.0 is out of range"),
        ("fedlws.beta=-0.01", r"fedlws\.beta = -0\.01 is out of range"),
        ("fedtlu.portion=0", r"fedtlu\.portion = 0\.0 is out of range"),
        ("fedtlu.portion=1.5", r"fedtlu\.portion = 1\.5 is out of range"),
        ("fedtlu.grouping=random", r"fedtlu\.grouping = 'random' is out of range"),
        ("strategy.wrap=fedfoo", r"unknown step\(s\) 'fedfoo'"),
        ("strategy.wrap=fedlws,fedlws", "list each step once"),
        ("depthwise_fim.reverse=1", r"depthwise_fim\.reverse = 1 has the wrong type"),
    ],
)
def test_bad_seed_settings_get_one_clear_line(override: str, message: str) -> None:
    with pytest.raises(FederationError, match=message) as caught:
        _config(override)
    assert "\n" not in str(caught.value)


def test_seed_defaults_and_wrap_forms(tmp_path: Path) -> None:
    config = _config()
    assert config.strategy.wrap == ()
    assert config.fedlws.beta == 0.01
    assert (config.fedtlu.portion, config.fedtlu.grouping) == (0.5, "body")
    assert config.depthwise_fim.reverse is False
    listed = _config('strategy.wrap=["fedlws", "fedtlu"]', "strategy.name=depthwise_fim", "depthwise_fim.reverse=true")
    assert listed.strategy.wrap == ("fedlws", "fedtlu")
    assert _config("strategy.wrap=fedlws,fedtlu").strategy.wrap == ("fedlws", "fedtlu")
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(listed), encoding="utf-8")
    assert load_config(path) == listed


# --- depth-wise FIM (paper 000) -------------------------------------------------------------------------------------


def test_depthwise_fim_aggregates_each_unit_from_its_top_clients() -> None:
    strategy = _build("strategy.name=depthwise_fim")  # default nhead 1: the classifier stays local
    assert isinstance(strategy, DepthwiseFisher)
    assert strategy.shared_keys(KEYS, [u for _, u in UNITS]) == SHARED
    sent = strategy.configure_train(1, [0, 1, 2])
    assert (sent[0].recipe.head_epochs, sent[0].recipe.fisher_batch) == (0, 32)  # whole model, one phase
    assert sent[0].prox_centre is None
    # Traces 4, 1, 3 over 5 shared units: M_j = ceil(3j/5) = 1, 2, 2, 3, 3; order client 0, 2, 1.
    record = strategy.aggregate_train(1, _replies({0: 4.0, 1: 1.0, 2: 3.0}))
    assert record["top"] == [1, 2, 2, 3, 3]
    assert record["units"] == ["features.0", "features.1", "features.2", "features.3", "features.4"]
    assert record["layer_weights"][0] == [1.0, 0.0, 0.0]
    assert record["layer_weights"][1] == pytest.approx([4 / 7, 0.0, 3 / 7], abs=1e-15)
    new = _global(strategy)
    expected = {
        # unit 1: client 0 alone, its BatchNorm statistics and counter included
        "features.0.weight": [2.0, 2.0],
        "features.0.running_mean": [1.0, 1.0],
        # units 2-3: 4/7 client 0 + 3/7 client 2
        "features.1.weight": [3.0, 32 / 7],  # 4/7*[3,5] + 3/7*[3,4]
        "features.1.bias": [4 / 7, 0.0],
        "features.2.weight": [4 / 7, 0.0],
        "features.2.bias": [0.0, 3 / 7],
        # units 4-5: everyone, 4/8, 1/8, 3/8
        "features.3.weight": [1.125, 0.5],  # 0.5*[1,1] + 0.125*[2,0] + 0.375*[1,0]
        "features.3.bias": [0.375, 0.75],  # 0.5*[0,1] + 0.125*[0,2] + 0.375*[1,0]
        "features.3.running_mean": [2.25, 0.75],  # 0.5*[1,1] + 0.125*[2,2] + 0.375*[4,0]
        "features.4.weight": [2.375, 0.75],  # 0.5*[2,1] + 0.125*[2,2] + 0.375*[3,0]
    }
    for k, v in expected.items():
        assert torch.allclose(new[k], torch.tensor(v), atol=1e-6), k
    assert int(new["features.0.num_batches_tracked"]) == 2


def test_depthwise_fim_reverse_uses_everyone_at_the_input_side() -> None:
    strategy = _build("strategy.name=depthwise_fim", "depthwise_fim.reverse=true")
    record = strategy.aggregate_train(1, _replies({0: 4.0, 1: 1.0, 2: 3.0}))
    assert record["top"] == [3, 3, 2, 2, 1]  # ceil(3 (5 - j + 1)/5)
    new = _global(strategy)
    assert torch.allclose(new["features.0.weight"], torch.tensor([1.5, 2.125]))  # 0.5*[2,2] + 0.125*[1,3] + 0.375*[1,2]
    assert torch.equal(new["features.4.weight"], torch.tensor([2.0, 1.0]))  # client 0 alone


def test_depthwise_fim_needs_fisher_traces_and_keeps_its_setting_on_resume() -> None:
    strategy = _build("strategy.name=depthwise_fim")
    with pytest.raises(FederationError, match="sent no fisher_trace"):
        strategy.aggregate_train(1, _replies())
    reverse = _build("strategy.name=depthwise_fim", "depthwise_fim.reverse=true")
    with pytest.raises(FederationError, match="reverse=True, not False"):
        strategy.load_state_json(reverse.state_json())


def test_wrappers_on_mobilenet_leave_batchnorm_statistics_alone() -> None:
    model = create_model("mobilenet_v3_small", num_classes=2)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    units = tuple(split_units(model))
    ctx = StrategyContext((0, 1), {0: 3, 1: 1}, tuple(initial), units, initial)
    tlu = build_strategy(_config("strategy.name=fedavg", "strategy.wrap=fedtlu"), ctx)
    assert isinstance(tlu, TargetedLayerUpdates)
    assert tlu.groups == [[f"features.{i}" for i in range(1, 12)]]
    lws = build_strategy(_config("strategy.name=fedavg", "strategy.wrap=fedlws", "fedlws.beta=0.1"), ctx)
    generator = torch.Generator().manual_seed(0)
    replies = {}
    for c in (0, 1):
        state = {
            k: v + torch.randn(v.shape, generator=generator) * 0.01 if v.is_floating_point() else v + 1
            for k, v in initial.items()
        }
        replies[c] = TrainReply(c, state, ctx.num_examples[c])
    record = lws.aggregate_train(1, replies)
    json.dumps(record, allow_nan=False)  # aggregation.jsonl accepts it
    log = record["fedlws"]
    assert every(0.0 < g <= 1.0 for g in log["gamma"])
    assert min(log["gamma"]) < 1.0
    new = _global(lws)
    statistics = [k for k in initial if k.endswith(("running_mean", "running_var"))]
    assert statistics
    for k in statistics:  # the FedAvg average 3/4, 1/4, unshrunk
        expected = 0.75 * replies[0].shared[k] + 0.25 * replies[1].shared[k]
        assert torch.allclose(new[k], expected, atol=1e-6), k


class _LocalBatchNorm(StrategyContext):
    """A federation whose BatchNorm statistics stay at the hospitals: they leave the shared keys."""

    def shared_keys(self, nhead: int) -> list[str]:
        return [k for k in super().shared_keys(nhead) if k not in BUFFERS]


def test_layers_and_blocks_are_the_shared_part_of_each_unit_when_batchnorm_stays_local() -> None:
    ctx = _LocalBatchNorm(CTX.hospitals, CTX.num_examples, KEYS, UNITS, INITIAL)
    replies = {
        c: TrainReply(c, {k: v for k, v in r.shared.items() if k not in BUFFERS}, r.num_examples, r.metrics)
        for c, r in _replies({0: 4.0, 1: 1.0, 2: 3.0}).items()
    }
    depthwise = DepthwiseFisher(_recipe_with_fisher(), 1, ctx, reverse=False)
    depthwise.aggregate_train(1, replies)
    new = _global(depthwise)
    assert set(new) == set(SHARED) - BUFFERS
    assert torch.equal(new["features.0.weight"], torch.tensor([2.0, 2.0]))  # unit 1 still has client 0 alone
    tlu = TargetedLayerUpdates(Averaging("fedavg", _recipe(), 1, ctx), ctx, PARAMS, portion=0.5, grouping="body")
    assert tlu.groups == [["features.1", "features.2", "features.3"]]
    assert tlu.aggregate_train(1, replies)["fedtlu"]["kept_previous"] == ["features.3"]
    assert torch.equal(_global(tlu)["features.3.bias"], INITIAL["features.3.bias"])


def _recipe_with_fisher() -> Recipe:
    return recipe_from_config(_config(), fisher_batch=8)


def test_a_wrapper_over_a_model_it_cannot_post_process_names_every_strategy_it_can() -> None:
    """The refusal lists exactly the averaging strategies of the registry (it once listed 4 of 7)."""
    from federation.methods import AVERAGING
    from federation.strategies.wrappers.base import GlobalModelWrapper

    class Elsewhere:
        name = "toy"

        def state_tensors(self) -> dict[str, torch.Tensor]:
            return {"not/a/state_dict/key": torch.zeros(1)}

    initial = {"w": torch.zeros(1)}
    ctx = StrategyContext(
        hospitals=(0,), num_examples={0: 1}, state_keys=tuple(initial), units=(), initial_state=initial
    )
    with pytest.raises(FederationError, match="keeps no such model") as info:
        GlobalModelWrapper(Elsewhere(), ctx, {"w"})  # type: ignore[arg-type]
    named = str(info.value).rsplit("wrap one of ", 1)[1].split(", ")
    assert sorted(named) == sorted(AVERAGING)
    assert len(named) >= 7  # today's seven averaging methods, and any added since
