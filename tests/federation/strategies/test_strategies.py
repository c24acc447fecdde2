"""Separate, FedAvg, FedProx and FedRep at the message level, with hand-computed numbers on unequal clients."""

from __future__ import annotations

import sys

import pytest
import torch
from support.checks import every

from federation import strategies
from federation.config import load_config
from federation.errors import FederationError
from federation.methods import AVERAGING
from federation.strategies import StrategyContext, build_strategy
from federation.wire.codec import decode, encode
from federation.wire.contract import Recipe, Strategy, TrainInstruction, TrainReply, TrainTask, count_values

# A two-unit "model": unit a (a weight, a BatchNorm running mean and its integer counter) and unit b (the head).
KEYS = ("a.weight", "a.running_mean", "a.num_batches_tracked", "b.weight")
UNITS = (("a", ["a.weight", "a.running_mean", "a.num_batches_tracked"]), ("b", ["b.weight"]))
INITIAL = {
    "a.weight": torch.zeros(2),
    "a.running_mean": torch.zeros(2),
    "a.num_batches_tracked": torch.tensor(0, dtype=torch.int64),
    "b.weight": torch.zeros(1),
}
# Unequal clients: 1, 2 and 5 training tiles -> FedAvg weights 1/8, 2/8, 5/8.
CTX = StrategyContext((0, 1, 2), {0: 1, 1: 2, 2: 5}, KEYS, UNITS, INITIAL)


def _state(weight: list[float], mean: list[float], tracked: int, head: float) -> dict[str, torch.Tensor]:
    return {
        "a.weight": torch.tensor(weight),
        "a.running_mean": torch.tensor(mean),
        "a.num_batches_tracked": torch.tensor(tracked, dtype=torch.int64),
        "b.weight": torch.tensor([head]),
    }


STATES = {
    0: _state([1.0, 2.0], [0.0, 4.0], 3, 1.0),
    1: _state([3.0, 0.0], [2.0, 2.0], 4, 2.0),
    2: _state([0.0, 8.0], [8.0, 0.0], 10, 3.0),
}


def _replies(keys: list[str]) -> dict[int, TrainReply]:
    return {
        c: TrainReply(c, {k: s[k] for k in keys}, CTX.num_examples[c], {"train_loss": 0.5}) for c, s in STATES.items()
    }


def _build(*overrides: str) -> Strategy:
    return build_strategy(load_config(None, list(overrides)), CTX)


def test_fedavg_weights_by_examples_exactly_including_batchnorm_buffers() -> None:
    fedavg = _build("strategy.name=fedavg", "strategy.nhead=0")
    keys = fedavg.shared_keys(KEYS, [u for _, u in UNITS])
    assert keys == list(KEYS)
    record = fedavg.aggregate_train(1, _replies(keys))
    assert record["weights"] == {"0": 0.125, "1": 0.25, "2": 0.625}
    sent = fedavg.configure_train(2, [0, 1, 2])
    shared = sent[1].shared
    assert shared is not None
    # a.weight: (1*1 + 2*3 + 5*0)/8 = 0.875, (1*2 + 2*0 + 5*8)/8 = 5.25
    assert torch.equal(shared["a.weight"], torch.tensor([0.875, 5.25]))
    # running mean (a buffer, averaged like a weight): (0 + 2*2 + 5*8)/8 = 5.5, (4 + 2*2 + 0)/8 = 1.0
    assert torch.equal(shared["a.running_mean"], torch.tensor([5.5, 1.0]))
    # integer counter: (3 + 2*4 + 5*10)/8 = 7.625 -> rounded back to an int64 8
    assert shared["a.num_batches_tracked"].dtype == torch.int64
    assert int(shared["a.num_batches_tracked"]) == 8
    # head: (1 + 2*2 + 5*3)/8 = 2.5
    assert torch.equal(shared["b.weight"], torch.tensor([2.5]))
    assert count_values(sent[0]) == 2 + 2 + 1 + 1
    assert fedavg.configure_evaluate(2, [0, 1, 2])[2] is shared


def test_fedavg_round_one_sends_the_common_initial_weights() -> None:
    sent = _build("strategy.name=fedavg").configure_train(1, [0, 1, 2])
    assert sorted(sent) == [0, 1, 2]
    assert every(torch.equal(sent[c].shared["a.weight"], INITIAL["a.weight"]) for c in sent)  # type: ignore[index]
    assert every(sent[c].prox_centre is None and sent[c].recipe.prox_mu == 0 for c in sent)


def test_fedprox_sends_the_global_weights_as_centre_counted_once() -> None:
    fedprox = _build("strategy.name=fedprox", "fedprox.mu=0.3")
    sent = fedprox.configure_train(1, [0, 1, 2])
    assert sorted(sent) == [0, 1, 2]
    for instruction in sent.values():
        assert instruction.recipe.prox_mu == 0.3
        assert instruction.centre_is_shared
        assert instruction.centre is instruction.shared
        assert count_values(instruction) == 6


def test_a_centre_is_counted_and_sent_by_what_the_instruction_says_not_by_identity() -> None:
    shared = {"a.weight": torch.ones(2), "b.weight": torch.ones(3)}
    copy = {k: v.clone() for k, v in shared.items()}
    once = TrainInstruction(0, Recipe(prox_mu=0.1), shared=shared, centre_is_shared=True)
    twice = TrainInstruction(0, Recipe(prox_mu=0.1), shared=shared, prox_centre=copy)
    # the same object given as a centre of its own is still a centre of its own: sent and counted again
    same_object = TrainInstruction(0, Recipe(prox_mu=0.1), shared=shared, prox_centre=shared)
    assert count_values(once) == 5
    assert count_values(twice) == count_values(same_object) == 10
    header, tensors = encode(TrainTask("r", 1, 0, list(shared), once))
    assert header["centre_is_shared"] is True
    assert sorted(tensors) == ["shared/a.weight", "shared/b.weight"]
    back = decode((header, tensors))
    assert isinstance(back, TrainTask)
    assert back.instruction.centre_is_shared
    assert back.instruction.centre is back.instruction.shared
    assert len(encode(TrainTask("r", 1, 0, list(shared), twice))[1]) == 4
    with pytest.raises(ValueError, match="centre_is_shared needs"):
        TrainInstruction(0, Recipe(), shared=None, centre_is_shared=True)


def test_fedrep_never_sends_the_head() -> None:
    fedrep = _build("strategy.name=fedrep")  # default nhead 1: unit b stays local
    keys = fedrep.shared_keys(KEYS, [u for _, u in UNITS])
    assert keys == ["a.weight", "a.running_mean", "a.num_batches_tracked"]
    fedrep.aggregate_train(1, _replies(keys))
    sent = fedrep.configure_train(2, [0, 1, 2])
    assert sorted(sent) == [0, 1, 2]
    for instruction in sent.values():
        assert instruction.shared is not None
        assert "b.weight" not in instruction.shared
        assert instruction.recipe.head_epochs == 1
        assert count_values(instruction) == 5
    evaluated = fedrep.configure_evaluate(2, [0, 1, 2])
    assert sorted(evaluated) == [0, 1, 2]
    assert every(v is not None and "b.weight" not in v for v in evaluated.values())
    assert torch.equal(sent[0].shared["a.weight"], torch.tensor([0.875, 5.25]))  # type: ignore[index]


def test_fedrep_without_a_head_is_rejected() -> None:
    with pytest.raises(FederationError, match=r"strategy\.nhead >= 1"):
        _build("strategy.name=fedrep", "strategy.nhead=0")


def test_separate_sends_and_receives_nothing() -> None:
    separate = _build("strategy.name=separate")
    assert separate.shared_keys(KEYS, [u for _, u in UNITS]) == []
    sent = separate.configure_train(1, [0, 1, 2])
    assert sorted(sent) == [0, 1, 2]
    assert every(i.shared is None and i.prox_centre is None and count_values(i) == 0 for i in sent.values())
    assert separate.aggregate_train(1, _replies([])) == {}
    assert separate.configure_evaluate(1, [0, 1, 2]) == {0: None, 1: None, 2: None}


def test_averaging_state_round_trips_through_checkpoint_tensors() -> None:
    first = _build("strategy.name=fedavg")
    first.aggregate_train(1, _replies(list(KEYS)))
    second = _build("strategy.name=fedavg")
    second.load_state_tensors(first.state_tensors())
    second.load_state_json(first.state_json())
    a, b = first.configure_train(2, [0])[0].shared, second.configure_train(2, [0])[0].shared
    assert a is not None
    assert b is not None
    assert every(torch.equal(a[k], b[k]) for k in KEYS)


def test_nhead_that_shares_nothing_or_overflows_is_rejected() -> None:
    with pytest.raises(FederationError, match="shares no layer"):
        _build("strategy.name=fedavg", "strategy.nhead=2")
    with pytest.raises(ValueError, match=r"0\.\.2"):
        _build("strategy.name=fedavg", "strategy.nhead=3")


def test_registry_imports_lazily_and_explains_a_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(strategies.STRATEGIES, "fedavg", "federation.strategies.not_written_yet")
    with pytest.raises(FederationError, match="not available"):
        _build("strategy.name=fedavg")
    assert "federation.strategies.not_written_yet" not in sys.modules
    # a strategy's module is imported when it is built, not when the registry is read
    monkeypatch.delitem(sys.modules, "federation.strategies.separate", raising=False)
    assert "federation.strategies.separate" not in sys.modules
    assert _build("strategy.name=separate").name == "separate"
    assert "federation.strategies.separate" in sys.modules


@pytest.mark.parametrize("name", sorted(AVERAGING))
def test_an_averaging_strategy_deploys_what_it_sends_next(name: str) -> None:
    # evaluates_next_start lets the engine evaluate round r with round r+1's training message (issue 21): only
    # right if what round r deploys at each hospital is exactly the shared part round r+1 sends it
    extra = ["client.optimizer=adam"] if name == "precision_weighted" else []
    strategy = _build(f"strategy.name={name}", "strategy.nhead=1", *extra)
    assert strategy.evaluates_next_start is True
    keys = strategy.shared_keys(KEYS, [u for _, u in UNITS])
    replies = {
        c: TrainReply(
            c,
            {k: s[k] for k in keys},
            CTX.num_examples[c],
            {"train_loss": 0.5, "fisher_trace": float(c + 1)},
            second_moments={k: s[k].abs() + 1.0 for k in keys if s[k].is_floating_point()},
        )
        for c, s in STATES.items()
    }
    strategy.aggregate_train(1, replies)
    deployed = strategy.configure_evaluate(1, [0, 1, 2])
    sent = strategy.configure_train(2, [0, 1, 2])
    for c in (0, 1, 2):
        shared = sent[c].shared
        evaluated = deployed[c]
        assert shared is not None
        assert evaluated is not None
        assert shared.keys() == evaluated.keys() == set(keys)
        assert every(torch.equal(shared[k], evaluated[k]) for k in keys)
    assert not all(torch.equal(sent[0].shared[k], INITIAL[k]) for k in keys)  # the round did move the model


def test_the_split_switch_is_a_fact_of_the_spec_not_of_a_name() -> None:
    """``split_switch`` on the spec decides whether a run splits: FedSAF's ``fedsaf.split = false`` shares every
    unit (nhead 0 kept at the hospital); a method without a switch keeps its nhead, and is refused ``fedsaf.split``;
    Separate, which shares nothing, leaves nothing for the hospital's policy to agree to."""
    from federation.hospital.policy import agreed_shared_keys
    from federation.methods import SPECS, split_on
    from federation.strategies.context import shared_nhead
    from models import create_model

    switched = [s.name for s in SPECS if s.split_switch is not None]
    assert switched == ["fedsaf"]
    assert shared_nhead(load_config(None, ["strategy.name=fedsaf", "strategy.nhead=3"])) == 3
    off = load_config(None, ["strategy.name=fedsaf", "strategy.nhead=3", "fedsaf.split=false"])
    assert (split_on(off), shared_nhead(off)) == (False, 0)
    fedrep = load_config(None, ["strategy.name=fedrep", "strategy.nhead=2"])
    assert (split_on(fedrep), shared_nhead(fedrep)) == (True, 2)
    with pytest.raises(FederationError, match=r"fedsaf\.split = False .*only with strategy\.name = fedsaf"):
        load_config(None, ["strategy.name=fedrep", "strategy.nhead=2", "fedsaf.split=false"])
    model = create_model("mobilenet_v3_small")
    assert agreed_shared_keys(load_config(None, ["strategy.name=separate"]), model) == []
    assert len(agreed_shared_keys(load_config(None, ["strategy.name=fedavg"]), model)) > 0


def test_every_strategy_states_its_two_evaluation_abilities() -> None:
    """``evaluates_own`` and ``evaluates_next_start`` are typed members of the protocol: every strategy class states
    both as booleans (never found by ``getattr``), no strategy claims both, and a wrapper states its inner's."""
    from federation.strategies.fedavg import Averaging
    from federation.strategies.fedsaf import AttentiveStrategy
    from federation.strategies.separate import Separate

    expected = {Averaging: (False, True), AttentiveStrategy: (True, False), Separate: (True, False)}
    for cls, abilities in expected.items():
        assert (cls.evaluates_own, cls.evaluates_next_start) == abilities
    from types import SimpleNamespace

    from federation.strategies.wrappers.base import GlobalModelWrapper

    for own, next_start in ((False, True), (True, False)):
        wrapper = object.__new__(GlobalModelWrapper)
        wrapper.inner = SimpleNamespace(evaluates_own=own, evaluates_next_start=next_start)  # type: ignore[assignment]
        assert (wrapper.evaluates_own, wrapper.evaluates_next_start) == (own, next_start)


def test_a_methods_own_settings_are_facts_of_its_spec() -> None:
    """``StrategySpec.settings`` names each method's own settings (no method-name sets in the dashboard's form):
    every one is a real configuration key, ``readers`` finds the methods that own it, and the form shows it for
    those methods alone."""
    import tomllib

    from app.dashboard.fields import FIELDS
    from federation.config.defaults import DEFAULTS_TOML
    from federation.methods import SPECS, readers

    defaults = tomllib.loads(DEFAULTS_TOML)
    owned = {key: spec.name for spec in SPECS for key in spec.settings}
    assert owned == {
        "fedprox.mu": "fedprox",
        "fedamp.dm": "fedamp",
        "amp.dm": "fedsaf",
        "fedsaf.fim": "fedsaf",
        "fedsaf.split": "fedsaf",
        "depthwise_fim.reverse": "depthwise_fim",
        "precision_weighted.eps": "precision_weighted",
        "precision_weighted.inverse": "precision_weighted",
    }
    for key, owner in owned.items():
        section, _, name = key.partition(".")
        assert name in defaults[section], key
        assert readers(key) == {owner}
    assert readers("client.lr") == frozenset()
    by_key = {f.key: f for f in FIELDS}
    for key, owner in owned.items():
        shown = {spec.name for spec in SPECS if by_key[key].applies({"strategy.name": spec.name})}
        assert shown == {owner}, key
    assert by_key["client.lr"].applies({"strategy.name": "fedprox"})
