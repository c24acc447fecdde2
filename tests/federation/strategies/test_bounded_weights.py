"""No hospital takes the aggregate: ``server.max_weight`` for every method, ``server.robust`` for the averaging ones.

The malicious hospital is played at the message level, on hand-made replies whose every number is worked out here:
a Fisher trace of 1e30 (FedSAF, FedAS, depth-wise FIM), a second moment of 0 (precision-weighted FL), a model
identical to the others' (FedAMP's attention), an update scaled by 50 (FedAvg with norm bounding), an outlier
value (the trimmed mean). Unset, every setting leaves the aggregate and the record as they were.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from federation.config import ServerSection, load_config
from federation.strategies import build_strategy
from federation.strategies.aggregation import cap_weights
from federation.strategies.context import StrategyContext
from federation.strategies.fedsaf import AmpSettings, AttentiveStrategy
from federation.strategies.fisher_weights import fisher_weights
from federation.strategies.precision_weighted import PrecisionWeighted
from federation.strategies.robust import bound_update_norms, trimmed_mean
from federation.wire.contract import Recipe, TrainReply

HOSTILE = 0
# unequal honest traces 2 and 6 beside the hostile 1e30
TRACES = [1e30, 2.0, 6.0]

# -- FedSAF: Fisher's gamma (Eq. 14) and AMP's xi (Eq. 3-8, 16) ------------------------------------------------------

RHO = [[1.0, 0.0, 2.0, 1.0], [0.0, 1.0, 2.0, 3.0], [2.0, 2.0, 0.0, 1.0]]
UNITS_SAF = (("0", ["0.weight"]), ("1", ["1.weight"]))


def _saf_ctx() -> StrategyContext:
    initial = {"0.weight": torch.zeros(2, 2, dtype=torch.float64), "1.weight": torch.ones(2, dtype=torch.float64)}
    return StrategyContext((0, 1, 2), {0: 10, 1: 30, 2: 60}, tuple(initial), UNITS_SAF, initial)


def _attentive(fim: bool, max_weight: float | None, alpha_k: float = 2.0, sigma: float = 10.0) -> AttentiveStrategy:
    amp = AmpSettings(alpha_k=alpha_k, sigma=sigma, lam=0.5, dm="euclidean", scale="raw")
    recipe = Recipe(epochs=1, lr=0.1, head_epochs=1, prox_mu=amp.prox_mu, fisher_batch=4 if fim else 0)
    return AttentiveStrategy(
        "fedsaf" if fim else "fedamp",
        amp=amp,
        nhead=1,
        fim=fim,
        recipe=recipe,
        ctx=_saf_ctx(),
        param_keys={"0.weight", "1.weight"},
        max_weight=max_weight,
    )


def _saf_replies(rho: list[list[float]], traces: list[float]) -> dict[int, TrainReply]:
    return {
        c: TrainReply(
            c,
            {"0.weight": torch.tensor(rho[c], dtype=torch.float64).reshape(2, 2)},
            [10, 30, 60][c],
            {"train_loss": 0.1, "fisher_trace": traces[c]},
        )
        for c in range(3)
    }


def _rows_equal(matrix: list[list[float]], expected: list[list[float]]) -> None:
    """Every entry of ``matrix`` equal to ``expected``'s within 1e-15, relative for the tiny ones (2e-30)."""
    assert len(matrix) == len(expected)
    for row, want in zip(matrix, expected, strict=True):
        assert len(row) == len(want)
        for got, value in zip(row, want, strict=True):
            assert got == pytest.approx(value, rel=1e-15, abs=0.0 if 0.0 < abs(value) < 1e-3 else 1e-15)


def _xi_by_hand(alpha_k: float, sigma: float) -> list[list[float]]:
    """Eq. 3-4 (squared L2), A'(d) = exp(-d / sigma) / sigma (Eq. 10), xi_ij = alpha_k A'(d_ij), Eq. 16."""
    xi = [[0.0] * 3 for _ in range(3)]
    for i in range(3):
        for j in range(3):
            if i != j:
                d = sum((a - b) ** 2 for a, b in zip(RHO[i], RHO[j], strict=True))
                xi[i][j] = alpha_k * math.exp(-d / sigma) / sigma
        xi[i][i] = 1.0 - sum(xi[i][j] for j in range(3) if j != i)
    return xi


def test_a_1e30_fisher_trace_takes_gamma_whole_without_the_cap() -> None:
    record = _attentive(fim=True, max_weight=None).aggregate_train(1, _saf_replies(RHO, TRACES))
    # gamma_i = t_i / sum t (Eq. 14): 1e30 + 8 rounds to 1e30 in float64 (its spacing there is 2^47), so
    # gamma = [1, 2/1e30, 6/1e30]
    assert record["gamma"][HOSTILE] == 1.0
    assert record["gamma"] == pytest.approx([1.0, 2e-30, 6e-30], rel=1e-15, abs=0.0)
    assert "weight_cap" not in record
    assert "weights" not in record  # the record is what it always was
    # every hospital receives p = sum_j (gamma^T xi)_j rho_j: the hostile one's weight is xi_00 = 0.8089...
    xi = _xi_by_hand(2.0, 10.0)
    assert record["xi"][0] == pytest.approx(xi[0], rel=1e-12)


def test_a_1e30_fisher_trace_gets_max_weight_and_the_others_share_the_rest_by_their_traces() -> None:
    record = _attentive(fim=True, max_weight=0.5).aggregate_train(1, _saf_replies(RHO, TRACES))
    # capped at 0.5; the other 0.5 goes to hospitals 1 and 2 as 2 : 6 -> 0.125 and 0.375
    assert record["gamma"] == pytest.approx([0.5, 0.125, 0.375], abs=1e-15)
    assert record["weight_cap"] == {"max_weight": 0.5, "capped": ["0"], "uniform": False}
    # each hospital's weight in p, sum_i gamma_i xi_ij, worked out by hand (alpha_k / sigma = 0.2 < 0.5: the cap
    # leaves xi as it is); the hostile one has 0.4487, not 0.8089
    xi = _xi_by_hand(2.0, 10.0)
    gamma = [0.5, 0.125, 0.375]
    expected = [sum(gamma[i] * xi[i][j] for i in range(3)) for j in range(3)]
    assert expected[HOSTILE] == pytest.approx(0.44867, abs=1e-5)
    weights = record["weights"]
    assert [weights[str(j)] for j in range(3)] == pytest.approx(expected, rel=1e-12)
    assert max(weights.values()) <= 0.5


def test_the_cap_lowers_amp_weights_of_other_hospitals_and_keeps_the_excess_at_home() -> None:
    # Three identical models: d_ij = 0, so xi_ij = alpha_k / sigma = 5 / 10 = 0.5 and xi_ii = 1 - 2 * 0.5 = 0
    # (FedAMP: each hospital's z_i is only the others' models). Capped at 0.4: xi_ij = 0.4, xi_ii = 1 - 0.8 = 0.2.
    same = [RHO[0]] * 3
    plain = _attentive(fim=False, max_weight=None, alpha_k=5.0).aggregate_train(1, _saf_replies(same, TRACES))
    assert plain["xi"] == [[0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.5, 0.5, 0.0]]
    capped = _attentive(fim=False, max_weight=0.4, alpha_k=5.0).aggregate_train(1, _saf_replies(same, TRACES))
    _rows_equal(capped["xi"], [[0.2, 0.4, 0.4], [0.4, 0.2, 0.4], [0.4, 0.4, 0.2]])
    assert capped["weight_cap"] == {"max_weight": 0.4, "capped": ["0", "1", "2"], "uniform": False}


def test_fisher_traces_whose_sum_overflows_keep_their_ratios() -> None:
    assert fisher_weights([1e308, 1e308, 0.0]).tolist() == [0.5, 0.5, 0.0]
    assert fisher_weights([2.0, 6.0]).tolist() == [0.25, 0.75]


# -- the averaging methods: FedAS, depth-wise FIM, precision-weighted, FedAvg ---------------------------------------

KEYS = ("a.weight", "b.weight")
UNITS = (("a", ["a.weight"]), ("b", ["b.weight"]))
INITIAL = {"a.weight": torch.zeros(2), "b.weight": torch.zeros(1)}
# Unequal clients: 1, 2 and 5 training tiles -> FedAvg weights 1/8, 2/8, 5/8.
CTX = StrategyContext((0, 1, 2), {0: 1, 1: 2, 2: 5}, KEYS, UNITS, INITIAL)
# honest updates from the zero model, norms 3, 4 and 5
VALUES = {0: [3.0, 0.0, 0.0], 1: [0.0, 4.0, 0.0], 2: [0.0, 0.0, 5.0]}


def _replies(values: dict[int, list[float]], traces: list[float] | None = None) -> dict[int, TrainReply]:
    out = {}
    for c, v in values.items():
        metrics = {"train_loss": 0.5} | ({"fisher_trace": traces[c]} if traces else {})
        shared = {"a.weight": torch.tensor(v[:2]), "b.weight": torch.tensor(v[2:])}
        out[c] = TrainReply(c, shared, CTX.num_examples[c], metrics)
    return out


def _merged(strategy: Any) -> list[float]:
    state = strategy.state_tensors()
    return [*state["a.weight"].tolist(), *state["b.weight"].tolist()]


def test_fedas_gamma_is_capped_like_fedsafs() -> None:
    plain = build_strategy(load_config(None, ["strategy.name=fedas", "strategy.nhead=0"]), CTX)
    record = plain.aggregate_train(1, _replies(VALUES, TRACES))
    assert record["weights"]["0"] == 1.0
    assert set(record) == {"fisher_traces", "weights"}
    overrides = ["strategy.name=fedas", "strategy.nhead=0", "server.max_weight=0.5"]
    capped = build_strategy(load_config(None, overrides), CTX)
    record = capped.aggregate_train(1, _replies(VALUES, TRACES))
    assert record["weights"] == pytest.approx({"0": 0.5, "1": 0.125, "2": 0.375}, abs=1e-15)
    assert record["weight_cap"] == {"max_weight": 0.5, "capped": ["0"], "uniform": False}
    assert _merged(capped) == pytest.approx([0.5 * 3, 0.125 * 4, 0.375 * 5], abs=1e-6)


def test_depthwise_fim_caps_each_layers_weights() -> None:
    # 2 shared units, 3 clients: M_1 = ceil(3/2) = 2 (clients 0 and 2, the largest traces), M_2 = 3 (Eq. 1).
    overrides = ["strategy.name=depthwise_fim", "strategy.nhead=0"]
    record = build_strategy(load_config(None, overrides), CTX).aggregate_train(1, _replies(VALUES, TRACES))
    _rows_equal(record["layer_weights"], [[1.0, 0.0, 6e-30], [1.0, 2e-30, 6e-30]])
    capped = build_strategy(load_config(None, [*overrides, "server.max_weight=0.5"]), CTX)
    record = capped.aggregate_train(1, _replies(VALUES, TRACES))
    # unit a: 1.0 -> 0.5; client 2 holds all of the selected rest (client 1 was not selected: weight 0 stays 0)
    # unit b: as gamma, [0.5, 0.125, 0.375]
    _rows_equal(record["layer_weights"], [[0.5, 0.0, 0.5], [0.5, 0.125, 0.375]])
    assert record["weight_cap"] == {"max_weight": 0.5, "capped": ["0"], "uniform": False}
    assert _merged(capped) == pytest.approx([0.5 * 3, 0.0, 0.375 * 5], abs=1e-6)


def test_precision_weighted_caps_every_values_weights() -> None:
    # The hostile hospital reports second moments of 0: pi = (1/eps) / (1/eps + 2/(1 + eps)) ~ 1 - 2e-8 at every
    # value. Capped at 0.5, the others share 0.5 equally (their precisions are equal): [0.5, 0.25, 0.25].
    recipe = Recipe(epochs=1, lr=0.001, optimizer="adam", second_moments=True)
    keys = {"a.weight", "b.weight"}
    moments = {0: 0.0, 1: 1.0, 2: 1.0}
    replies = _replies(VALUES)
    for c, reply in replies.items():
        reply.second_moments = {k: torch.full_like(v, moments[c]) for k, v in reply.shared.items()}
    plain = PrecisionWeighted(recipe, 0, CTX, keys, 1e-8, True)
    record = plain.aggregate_train(1, replies)
    assert "weight_cap" not in record
    assert _merged(plain)[0] == pytest.approx(3.0, rel=1e-7)  # the hostile value takes (almost) all
    capped = PrecisionWeighted(recipe, 0, CTX, keys, 1e-8, True, ServerSection(max_weight=0.5))
    record = capped.aggregate_train(1, replies)
    assert _merged(capped) == pytest.approx([0.5 * 3, 0.25 * 4, 0.25 * 5], abs=1e-6)
    # the buffers' and fallback weights n_i / n = [1/8, 2/8, 5/8] are capped too: client 2's was lowered
    assert record["weight_cap"] == {"max_weight": 0.5, "capped": ["0", "2"], "uniform": False}


def test_cap_weights_caps_every_column_of_a_matrix_on_its_own() -> None:
    columns = torch.tensor([[1.0, 0.6, 0.2], [0.0, 0.3, 0.3], [0.0, 0.1, 0.5]], dtype=torch.float64)
    capped = cap_weights(columns, 0.5)
    assert capped[:, 0].tolist() == [0.5, 0.25, 0.25]  # no uncapped mass: spread evenly
    assert capped[:, 1].tolist() == pytest.approx([0.5, 0.375, 0.125], abs=1e-15)  # 0.3 : 0.1
    assert capped[:, 2].tolist() == [0.2, 0.3, 0.5]  # at the cap is not above it: as given
    for column in range(3):
        assert capped[:, column].tolist() == cap_weights(columns[:, column], 0.5).tolist()


# -- robust aggregation: norm bounding (Sun et al., 2019) and the trimmed mean (Yin et al., 2018) -------------------

SCALED = {**VALUES, 2: [0.0, 0.0, 250.0]}  # hospital 2 sends its honest update scaled by 50


def _fedavg(*overrides: str) -> Any:
    return build_strategy(load_config(None, ["strategy.name=fedavg", "strategy.nhead=0", *overrides]), CTX)


def _distance(a: list[float], b: list[float]) -> float:
    return math.dist(a, b)


def test_an_update_scaled_by_50_moves_fedavg_153_units_and_norm_bounding_0_4() -> None:
    # The honest weighted mean, 1/8 [3, 0, 0] + 2/8 [0, 4, 0] + 5/8 [0, 0, 5]:
    plain = _fedavg()
    plain.aggregate_train(1, _replies(SCALED))
    assert _merged(plain) == [0.375, 1.0, 156.25]  # 5/8 * 250
    assert _distance(_merged(plain), [0.375, 1.0, 3.125]) == 153.125

    # norm bounding needs a weight cap below 1/2: 1/8, 2/8, 5/8 capped at 0.4 -> 0.2, 0.4, 0.4
    bounded = _fedavg("server.robust=norm_bound", "server.max_weight=0.4")
    record = bounded.aggregate_train(1, _replies(SCALED))
    # norms 3, 4, 250: median 4, bound 1 x 4; hospital 2's update is clipped to [0, 0, 4]
    assert record["robust"] == {
        "method": "norm_bound",
        "factor": 1.0,
        "median_norm": 4.0,
        "bound": 4.0,
        "norms": {"0": 3.0, "1": 4.0, "2": 250.0},
        "clipped": ["2"],
    }
    assert record["weights"] == pytest.approx({"0": 0.2, "1": 0.4, "2": 0.4}, rel=1e-15)
    assert record["weight_cap"] == {"max_weight": 0.4, "capped": ["2"], "uniform": False}
    # the honest mean under the same cap: 0.2 [3, 0, 0] + 0.4 [0, 4, 0] + 0.4 [0, 0, 5] = [0.6, 1.6, 2.0]
    assert _merged(bounded) == pytest.approx([0.6, 1.6, 1.6], rel=1e-6)
    # |1.6 - 2.0| = 0.4 x |4 - 5|: within the bound w_2 (M + ||honest update||) = 0.4 x (4 + 5) = 3.6
    assert _distance(_merged(bounded), [0.6, 1.6, 2.0]) == pytest.approx(0.4, rel=1e-6)
    # and the attack buys nothing: the honest hospital 2 is clipped to the same [0, 0, 4]
    honest_run = _fedavg("server.robust=norm_bound", "server.max_weight=0.4")
    honest_run.aggregate_train(1, _replies(VALUES))
    assert _merged(honest_run) == _merged(bounded)


def test_norm_bounding_measures_updates_from_the_rounds_global_model() -> None:
    bounded = _fedavg("server.robust=norm_bound", "server.norm_factor=2.0", "server.max_weight=0.4")
    bounded.aggregate_train(1, _replies(VALUES))  # norms 3, 4, 5, bound 8: nothing clipped
    assert _merged(bounded) == pytest.approx([0.6, 1.6, 2.0], rel=1e-6)
    # round 2 starts from [0.6, 1.6, 2.0]: hospital 0 returns that plus [0, 0, 100] (norm 100, clipped to 2 x 5)
    start = _merged(bounded)
    second = {c: [s + d for s, d in zip(start, delta, strict=True)] for c, delta in VALUES.items()}
    second[0] = [start[0], start[1], start[2] + 100.0]
    record = bounded.aggregate_train(2, _replies(second))
    assert record["robust"]["norms"] == pytest.approx({"0": 100.0, "1": 4.0, "2": 5.0}, rel=1e-6)
    assert record["robust"]["clipped"] == ["0"]
    assert record["robust"]["bound"] == pytest.approx(10.0, rel=1e-6)  # 2 x median 5


def test_bound_update_norms_leaves_unclipped_rows_bit_for_bit() -> None:
    vectors = torch.tensor([[0.1, 0.2], [0.3, -0.7], [30.0, 40.0]], dtype=torch.float32)
    reference = torch.tensor([0.05, 0.05], dtype=torch.float32)
    out = bound_update_norms(vectors, reference, 1.0)
    assert out.clipped.tolist() == [False, False, True]
    assert torch.equal(out.vectors[:2], vectors[:2])
    clipped_norm = torch.linalg.vector_norm(out.vectors[2].double() - reference.double())
    assert float(clipped_norm) == pytest.approx(out.bound, rel=1e-6)
    assert out.median == pytest.approx(float(out.norms[1]), rel=1e-15)


def test_the_trimmed_mean_drops_the_outlier_at_every_value() -> None:
    values = {0: [1.0, 2.0, 3.0], 1: [4.0, 5.0, 6.0], 2: [100.0, -100.0, 7.0]}
    strategy = _fedavg("server.robust=trimmed_mean")
    record = strategy.aggregate_train(1, _replies(values))
    # per value, sorted: (1, 4, 100) -> 4; (-100, 2, 5) -> 2; (3, 6, 7) -> 6
    assert _merged(strategy) == [4.0, 2.0, 6.0]
    assert record == {"clients": [0, 1, 2], "robust": {"method": "trimmed_mean", "trim": 1}}
    # a round with two replies (one left out) cannot drop one at each end: it averages them, and says so
    record = strategy.aggregate_train(2, _replies({0: values[0], 1: values[1]}))
    assert record["robust"] == {"method": "trimmed_mean", "trim": 0, "trim_set": 1}
    assert _merged(strategy) == [2.5, 3.5, 4.5]
    assert trimmed_mean(torch.tensor([[1.0], [2.0], [9.0], [10.0], [11.0]]), 2).tolist() == [9.0]
    with pytest.raises(ValueError, match="cannot drop 2 at each end"):
        trimmed_mean(torch.tensor([[1.0], [2.0], [3.0]]), 2)


def test_without_the_settings_every_record_is_what_it_was() -> None:
    strategy = _fedavg()
    assert strategy.aggregate_train(1, _replies(VALUES)) == {"weights": {"0": 0.125, "1": 0.25, "2": 0.625}}
    saf = _attentive(fim=True, max_weight=None).aggregate_train(1, _saf_replies(RHO, TRACES))
    assert set(saf) == {
        "clients",
        "dm",
        "scale",
        "distances",
        "xi",
        "off_diagonal_mass",
        "fisher_traces",
        "gamma",
    }
