"""FedSAF's server (paper 001, Eq. 3-8, 14, 16-20, 23-25; Algorithm 1) on hand-checkable clients.

Three unequal clients whose shared part is one 2x2 weight (4 values), so every number is worked out by hand.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from support.checks import every

from federation.config import RunConfig, config_from_dict
from federation.errors import FederationError
from federation.strategies import build_strategy
from federation.strategies.context import StrategyContext
from federation.strategies.fedsaf import AmpSettings, AttentiveStrategy, CollaborationWarning
from federation.wire.contract import Recipe, TrainReply, count_reply_values, count_values
from models import create_model, head_keys, split_units

RHO = [
    [1.0, 0.0, 2.0, 1.0],
    [0.0, 1.0, 2.0, 3.0],
    [2.0, 2.0, 0.0, 1.0],
]
TRACES = [2.0, 1.0, 5.0]
# Toy model: unit "0" (shared, 4 values + a 2-value buffer), unit "1" (the head, 6 values).
UNITS = (("0", ["0.weight", "0.running_mean"]), ("1", ["1.weight", "1.bias"]))
PARAMS = {"0.weight", "1.weight", "1.bias"}


def _ctx() -> StrategyContext:
    initial = {
        "0.weight": torch.zeros(2, 2),
        "0.running_mean": torch.zeros(2),
        "1.weight": torch.ones(2, 2),
        "1.bias": torch.zeros(2),
    }
    return StrategyContext(
        hospitals=(0, 1, 2),
        num_examples={0: 10, 1: 30, 2: 60},
        state_keys=tuple(initial),
        units=UNITS,
        initial_state=initial,
    )


def _strategy(fim: bool, alpha_k: float = 2.0, sigma: float = 10.0) -> AttentiveStrategy:
    amp = AmpSettings(alpha_k=alpha_k, sigma=sigma, lam=0.5, dm="euclidean", scale="raw")
    recipe = Recipe(epochs=1, lr=0.1, head_epochs=1, prox_mu=amp.prox_mu, fisher_batch=4 if fim else 0)
    return AttentiveStrategy("fedsaf", amp=amp, nhead=1, fim=fim, recipe=recipe, ctx=_ctx(), param_keys=PARAMS)


def _replies(running_means: list[list[float]] | None = None) -> dict[int, TrainReply]:
    means = running_means or [[0.0, 0.0]] * 3
    return {
        c: TrainReply(
            client=c,
            shared={"0.weight": torch.tensor(RHO[c]).reshape(2, 2), "0.running_mean": torch.tensor(means[c])},
            num_examples=[10, 30, 60][c],
            metrics={"train_loss": 0.1, "fisher_trace": TRACES[c]},
        )
        for c in range(3)
    }


def test_round_one_sends_the_common_initial_model_as_start_and_centre() -> None:
    strategy = _strategy(fim=True)
    plan = strategy.configure_train(1, [0, 1, 2])
    for c in range(3):
        shared = plan[c].shared
        assert plan[c].centre_is_shared  # the start is the centre: sent and counted once
        assert plan[c].prox_centre is None
        assert shared is not None
        assert torch.equal(shared["0.weight"], torch.zeros(2, 2))
        assert plan[c].recipe.prox_mu == pytest.approx(0.5 / 2.0)  # lambda / alpha_k
        assert count_values(plan[c]) == 4 + 2


def test_fim_on_gives_every_client_the_same_hand_computed_p() -> None:
    strategy = _strategy(fim=True)
    record = strategy.aggregate_train(1, _replies())
    # xi from squared distances 6, 9, 13 with alpha_k / sigma = 0.2: xi_12 = 0.2 e^-0.6 = 0.1097623, ...
    assert record["xi"][0][1] == pytest.approx(0.1097623, abs=1e-7)
    assert record["xi"][0][0] == pytest.approx(0.8089237, abs=1e-7)
    assert record["distances"][1][2] == pytest.approx(13.0)
    # gamma = [2, 1, 5] / 8
    assert record["gamma"] == [0.25, 0.125, 0.625]
    assert record["fisher_traces"] == TRACES
    # z_1 = [0.9715515, 0.2723901, 1.8373720, 1.2195245]; z_2 = [0.2187750, 0.9447440, 1.8909873, 2.6714626]
    # z_3 = [1.8096733, 1.7828658, 0.2716406, 1.1090128]
    # p = 0.25 z_1 + 0.125 z_2 + 0.625 z_3:
    #   p[0] = 0.2428879 + 0.0273469 + 1.1310458 = 1.4012806
    #   p[1] = 0.0680975 + 0.1180930 + 1.1142911 = 1.3004817
    #   p[2] = 0.4593430 + 0.2363734 + 0.1697754 = 0.8654918
    #   p[3] = 0.3048811 + 0.3339328 + 0.6931330 = 1.3319469
    expected = torch.tensor([1.4012806, 1.3004817, 0.8654918, 1.3319469])
    plan = strategy.configure_train(2, [0, 1, 2])
    for c in range(3):
        centre = plan[c].centre
        assert centre is not None
        assert torch.allclose(centre["0.weight"].flatten(), expected, atol=1e-6)
        assert torch.equal(centre["0.weight"], plan[0].shared["0.weight"])  # type: ignore[index]
        assert set(centre) == {"0.weight", "0.running_mean"}  # the head is never sent


def test_fim_off_gives_each_client_its_own_z() -> None:
    strategy = _strategy(fim=False)
    record = strategy.aggregate_train(1, _replies())
    assert "gamma" not in record
    plan = strategy.configure_train(2, [0, 1, 2])
    z = {
        0: [0.9715515, 0.2723901, 1.8373720, 1.2195245],
        1: [0.2187750, 0.9447440, 1.8909873, 2.6714626],
        2: [1.8096733, 1.7828658, 0.2716406, 1.1090128],
    }
    for c in range(3):
        centre = plan[c].shared
        assert centre is not None
        assert centre["0.weight"].flatten().tolist() == pytest.approx(z[c], abs=1e-6)


def test_buffers_are_mixed_with_xi_but_do_not_enter_the_distances() -> None:
    strategy = _strategy(fim=False)
    # Wildly different running means must not change xi (distances use trainable parameters only) ...
    record = strategy.aggregate_train(1, _replies([[0.0, 0.0], [100.0, 0.0], [0.0, 300.0]]))
    assert record["distances"][0][1] == pytest.approx(6.0)
    # ... but they are mixed with the same weights: client 1's running mean = xi_12 * 100 + xi_13 * 0 ... for value 0
    #   = 0.1097623 * 100 = 10.97623; value 1 = xi_13 * 300 = 0.0813139 * 300 = 24.39417
    centre = strategy.configure_train(2, [0])[0].shared
    assert centre is not None
    assert centre["0.running_mean"].tolist() == pytest.approx([10.97623, 24.39417], abs=1e-4)


def test_fim_on_requires_the_clients_fisher_traces() -> None:
    strategy = _strategy(fim=True)
    replies = _replies()
    replies[1].metrics.pop("fisher_trace")
    with pytest.raises(FederationError, match="hospital 1 sent no fisher_trace"):
        strategy.aggregate_train(1, replies)


def test_vanishing_collaboration_is_warned_about() -> None:
    # sigma = 0.01 against squared distances of 6-13: e^-600 underflows, the clients train alone
    strategy = _strategy(fim=False, alpha_k=0.001, sigma=0.01)
    with pytest.warns(CollaborationWarning, match=r"round 3.*barely collaborate"):
        record = strategy.aggregate_train(3, _replies())
    assert record["off_diagonal_mass"] < 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("error", CollaborationWarning)
        _strategy(fim=False).aggregate_train(1, _replies())  # mass 0.16: no warning


@pytest.mark.parametrize("fim", [False, True])
def test_checkpoint_state_round_trip_through_safetensors(fim: bool) -> None:
    from safetensors.torch import load, save

    strategy = _strategy(fim=fim)
    for server_round in (1, 2):
        # round 1 holds the shared initial model, round 2 per-client z_i (FIM off) or the common p (FIM on):
        # safetensors refuses tensors that share memory, so each must serialise.
        tensors, meta = load(save(strategy.state_tensors())), strategy.state_json()
        fresh = _strategy(fim=fim)
        fresh.load_state_json(meta)
        fresh.load_state_tensors(tensors)
        for c in range(3):
            a = strategy.configure_train(server_round, [c])[c].shared
            b = fresh.configure_train(server_round, [c])[c].shared
            assert a is not None
            assert b is not None
            assert torch.equal(a["0.weight"], b["0.weight"])
        strategy.aggregate_train(server_round, _replies())
    with pytest.raises(FederationError, match=f"fim={fim}, not {not fim}"):
        _strategy(fim=not fim).load_state_json(meta)


def _mobilenet_ctx() -> tuple[StrategyContext, dict[str, torch.Tensor], list[tuple[str, list[str]]]]:
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small", num_classes=2)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    units = split_units(model)
    ctx = StrategyContext(
        hospitals=(0, 1, 2),
        num_examples={0: 5, 1: 7, 2: 9},
        state_keys=tuple(state),
        units=tuple(units),
        initial_state=state,
    )
    return ctx, state, units


def _config(**sections: dict[str, object]) -> RunConfig:
    raw: dict[str, dict[str, object]] = {
        "strategy": {"name": "fedsaf"},
        "amp": {"alpha_k": 0.01, "sigma": 1.0, "scale": "relative"},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config_from_dict(raw)


def test_values_sent_shrink_with_nhead_and_match_the_state_dict() -> None:
    ctx, state, units = _mobilenet_ctx()
    sent: list[int] = []
    for nhead in (0, 3, 6, 9, 12):
        config = _config(strategy={"name": "fedsaf", "nhead": nhead})
        strategy = build_strategy(config, ctx)
        head = set(head_keys(units, nhead))
        expected = sum(v.numel() for k, v in state.items() if k not in head)
        # round 1, and (for the two ends of the range, to keep the test quick) round 2 after aggregating replies
        for server_round in (1, 2) if nhead in (0, 12) else (1,):
            plan = strategy.configure_train(server_round, [0, 1, 2])
            replies = {}
            for c in range(3):
                assert count_values(plan[c]) == expected
                shared = plan[c].shared
                assert shared is not None
                assert not head & set(shared)
                replies[c] = _perturbed_reply(c, shared)
            assert every(count_reply_values(r) == expected for r in replies.values())
            strategy.aggregate_train(server_round, replies)
        sent.append(expected)
    assert sent == sorted(sent, reverse=True)
    assert len(set(sent)) == 5  # strictly decreasing
    assert sent[0] == sum(v.numel() for v in state.values())  # nhead 0 shares the whole state_dict


def _perturbed_reply(c: int, shared: dict[str, torch.Tensor]) -> TrainReply:
    moved = {k: v + 0.001 * (c + 1) if v.is_floating_point() else v for k, v in shared.items()}
    return TrainReply(client=c, shared=moved, num_examples=5, metrics={"fisher_trace": 1.0 + c})


def test_split_off_shares_everything_in_one_phase_and_fim_off_asks_for_no_trace() -> None:
    ctx, state, _ = _mobilenet_ctx()
    strategy = build_strategy(_config(strategy={"name": "fedsaf", "nhead": 6}, fedsaf={"split": False}), ctx)
    plan = strategy.configure_train(1, [0])
    assert count_values(plan[0]) == sum(v.numel() for v in state.values())
    assert plan[0].recipe.head_epochs == 0
    assert plan[0].recipe.fisher_batch == 32
    strategy = build_strategy(_config(fedsaf={"fim": False}), ctx)
    plan = strategy.configure_train(1, [0])
    assert plan[0].recipe.fisher_batch == 0
    assert plan[0].recipe.head_epochs == 1


def test_settings_that_could_make_a_self_weight_negative_are_rejected_at_build() -> None:
    ctx, _, _ = _mobilenet_ctx()
    with pytest.raises(FederationError, match=r"amp.alpha_k=0.6 .*3 hospitals.*alpha_k <= 0.5"):
        build_strategy(_config(amp={"alpha_k": 0.6, "sigma": 1.0}), ctx)
    with pytest.raises(FederationError, match="head_epochs >= 1"):
        build_strategy(_config(client={"head_epochs": 0, "epochs": 1}), ctx)
    assert math.isclose(AmpSettings(0.5, 1.0, 0.1, "euclidean", "raw").prox_mu, 0.2)
