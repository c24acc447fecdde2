"""The defences hold or refuse (issue 48, part 4), played by a hostile hospital on hand-made replies.

A hospital declaring 10^6 tiles beside two of 250 and sending its update sign-flipped and scaled by 50: norm bounding
alone (the old behaviour) lets it win, so ``server.robust = "norm_bound"`` now needs ``server.max_weight`` below 1/2
and then the honest direction wins, by a margin worked out here. A defence with fewer hospitals than it needs
(norm bounding with 2, the trimmed mean with 2, ``trim = 5`` with 3) is refused when the hospitals are listed and
again when the run starts with ``strategy.clients = "all"``; ``server.norm_factor`` is bounded; FedLWS's spread is
computed from the bounded updates.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from federation.config import load_config
from federation.errors import FederationError
from federation.strategies import build_strategy
from federation.strategies.aggregation import weighted_sum
from federation.strategies.context import StrategyContext
from federation.strategies.robust import bound_update_norms
from federation.strategies.wrappers.fedlws import LayerWiseShrinking
from federation.wire.contract import TrainReply

UNITS = (("a", ["a.weight"]), ("b", ["b.weight"]))
KEYS = ("a.weight", "b.weight")
INITIAL = {"a.weight": torch.zeros(2), "b.weight": torch.zeros(1)}
LIAR = 0
# hospital 0 declares 10^6 tiles, the two honest ones 250 each: n_0 / n = 10^6 / 1000500 = 0.9995
LYING_CTX = StrategyContext((0, 1, 2), {0: 10**6, 1: 250, 2: 250}, KEYS, UNITS, INITIAL)
# the honest hospitals move b by +4; the liar sends -50 x that
ATTACK = {0: [0.0, 0.0, -200.0], 1: [0.0, 0.0, 4.0], 2: [0.0, 0.0, 4.0]}


def _replies(ctx: StrategyContext, values: dict[int, list[float]]) -> dict[int, TrainReply]:
    return {
        c: TrainReply(
            c,
            {"a.weight": torch.tensor(v[:2]), "b.weight": torch.tensor(v[2:])},
            ctx.num_examples[c],
            {"train_loss": 0.5},
        )
        for c, v in values.items()
    }


def _build(ctx: StrategyContext, *overrides: str) -> Any:
    return build_strategy(load_config(None, ["strategy.name=fedavg", "strategy.nhead=0", *overrides]), ctx)


def _merged(strategy: Any) -> list[float]:
    state = strategy.state_tensors()
    return [*state["a.weight"].tolist(), *state["b.weight"].tolist()]


def _refusal(overrides: list[str], ctx: StrategyContext | None = None) -> FederationError:
    """The one-line refusal of ``overrides``: by the configuration (``ctx`` None) or when the run starts."""
    args = ["strategy.name=fedavg", "strategy.nhead=0", *overrides]
    if ctx is None:
        with pytest.raises(FederationError) as err:
            load_config(None, args)
        return err.value
    config = load_config(None, args)  # accepted: only the start knows how many hospitals answered
    with pytest.raises(FederationError) as err:
        build_strategy(config, ctx)
    return err.value


def test_norm_bounding_alone_lets_a_liar_of_1e6_tiles_win_and_is_now_refused() -> None:
    # what norm bounding alone gave: every update bounded to the median norm 4, but weights 0.9995 / 0.00025 x 2
    stacked = torch.tensor([ATTACK[c] for c in (0, 1, 2)])
    bounded = bound_update_norms(stacked, torch.zeros(3), 1.0)
    assert bounded.clipped.tolist() == [True, False, False]
    n = 10**6 + 500
    old = weighted_sum(bounded.vectors, [10**6 / n, 250 / n, 250 / n])
    assert float(old[2]) == pytest.approx(-4.0 * (10**6 - 500) / n, rel=1e-6)  # -3.998: the sign flip wins
    # the setting alone is refused, naming the setting that is missing and why
    err = _refusal(["server.robust=norm_bound"])
    assert err.key == "server.max_weight"
    assert str(err) == (
        "config server.robust = 'norm_bound' needs server.max_weight below 0.5 (it is None): norm bounding limits the "
        "size of each update, not its weight, so a hospital declaring 10^6 tiles would still carry the average; set "
        "server.max_weight (e.g. 0.4, at least 1/m for m hospitals)"
    )
    assert _refusal(["server.robust=norm_bound", "server.max_weight=0.5"]).key == "server.max_weight"


def test_with_max_weight_the_liar_weighs_0_4_and_the_honest_direction_wins() -> None:
    strategy = _build(LYING_CTX, "server.robust=norm_bound", "server.max_weight=0.4")
    record = strategy.aggregate_train(1, _replies(LYING_CTX, ATTACK))
    assert record["weights"] == {"0": 0.4, "1": 0.3, "2": 0.3}
    assert record["weight_cap"] == {"max_weight": 0.4, "capped": [str(LIAR)], "uniform": False}
    assert record["robust"]["clipped"] == [str(LIAR)]
    assert record["robust"]["median_norm"] == 4.0
    # 0.4 x (-4) + 0.3 x 4 + 0.3 x 4 = +0.8: the honest sign, at 1 - 2 x 0.4 = 0.2 of an honest step
    assert _merged(strategy) == pytest.approx([0.0, 0.0, 0.8], rel=1e-6)


def test_norm_bounding_with_two_hospitals_is_refused_listed_or_all() -> None:
    two = StrategyContext((0, 1), {0: 5, 1: 5}, KEYS, UNITS, INITIAL)
    expected = (
        "config server.robust = 'norm_bound' needs at least 3 hospitals, and this run has 2: the bound is the median "
        "update norm, an honest one only while more than half the hospitals are honest; leave server.robust unset or "
        "federate 3 or more hospitals"
    )
    # listed: refused by the configuration (a cap of 0.5 is the least two hospitals allow)
    listed = _refusal(["server.robust=norm_bound", "server.max_weight=0.5", "strategy.clients=[0, 1]"])
    assert (listed.key, str(listed)) == ("server.robust", expected)
    # clients = "all": refused when the run starts and the two hospitals have answered
    at_start = _refusal(["server.robust=norm_bound", "server.max_weight=0.45"], two)
    assert (at_start.key, str(at_start)) == ("server.robust", expected)


def test_the_trimmed_mean_with_two_hospitals_and_clients_all_is_refused_at_start() -> None:
    two = StrategyContext((0, 1), {0: 5, 1: 5}, KEYS, UNITS, INITIAL)
    err = _refusal(["server.robust=trimmed_mean"], two)  # clients = "all": only the start knows there are two
    assert err.key == "server.robust"
    assert str(err) == (
        "config server.robust = 'trimmed_mean' needs at least 3 hospitals, and this run has 2: with fewer it drops "
        "nothing and is a plain mean; leave server.robust unset or federate 3 or more"
    )


def test_trim_5_with_three_hospitals_is_refused_not_lowered_to_1() -> None:
    expected = (
        "config server.trim = 5 is out of range: with 3 hospitals dropping 5 at each end leaves none: use "
        "server.trim <= 1 (trim 5 needs at least 11 hospitals)"
    )
    at_start = _refusal(["server.robust=trimmed_mean", "server.trim=5"], LYING_CTX)
    assert (at_start.key, str(at_start)) == ("server.trim", expected)
    listed = _refusal(["server.robust=trimmed_mean", "server.trim=5", "strategy.clients=[0, 1, 2]"])
    assert (listed.key, str(listed)) == ("server.trim", expected)


@pytest.mark.parametrize("factor", ["1e-300", "0.5", "10.5", "inf"])
def test_a_norm_factor_outside_1_to_10_is_refused(factor: str) -> None:
    err = _refusal(["server.robust=norm_bound", "server.max_weight=0.4", f"server.norm_factor={factor}"])
    assert err.key == "server.norm_factor"
    assert str(err) == (
        f"config server.norm_factor = {float(factor)!r} is out of range: use a factor in [1, 10] of the median update "
        "norm (below 1 every honest update is shrunk too and the model stalls; above 10 a scaled update passes)"
    )


def test_norm_factors_1_and_10_are_accepted() -> None:
    for factor in ("1", "10"):
        config = load_config(
            None, ["server.robust=norm_bound", "server.max_weight=0.4", f"server.norm_factor={factor}"]
        )
        assert config.server.bound_factor == float(factor)


def test_fedlws_measures_its_spread_on_the_bounded_updates() -> None:
    ctx = StrategyContext((0, 1, 2), {0: 1, 1: 2, 2: 5}, KEYS, UNITS, INITIAL)
    scaled = {0: [3.0, 0.0, 0.0], 1: [0.0, 4.0, 0.0], 2: [0.0, 0.0, 250.0]}  # hospital 2: its [0, 0, 5] x 50
    inner = _build(ctx, "server.robust=norm_bound", "server.max_weight=0.4")
    lws = LayerWiseShrinking(inner, ctx, set(KEYS), beta=1.0)
    record = lws.aggregate_train(1, _replies(ctx, scaled))
    assert record["robust"]["clipped"] == ["2"]
    # layer b: updates 0, 0 and 250 bounded to 4 (median norm 4); mean 4/3, distances 4/3, 4/3, 8/3: tau = 16/9
    # (the raw updates would give 250/3, 250/3, 500/3: tau = 1000/9)
    assert record["fedlws"]["tau"][1] == pytest.approx(16 / 9, rel=1e-6)
