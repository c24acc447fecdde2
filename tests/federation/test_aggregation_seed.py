"""Exact-number tests of the seed methods' aggregation maths (papers 000, 002, 003, 004).

Unequal clients and unequal weights throughout; every expected number is worked out by hand in the comments
(or from the closed form written next to it), never by calling the function under test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from federation.errors import FederationError
from federation.strategies.depthwise_fim import depthwise_fisher_weights, depthwise_top_counts
from federation.strategies.precision_weighted import precision_weighted_sum
from federation.strategies.wrappers.fedlws import lws_factors, lws_spread
from federation.strategies.wrappers.fedtlu import tlu_scores


def _f64(rows: Sequence[Any]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# --- paper 000: depth-wise Fisher weights -------------------------------------------------------------------------


def test_depthwise_weights_keep_the_top_clients_per_layer() -> None:
    # Four clients with Fisher traces 2, 6, 1, 3; three layers. M_j = ceil(j/3 * 4): 2, 3, 4.
    # By trace: client 1 (6), client 3 (3), client 0 (2), client 2 (1).
    weights = depthwise_fisher_weights([2.0, 6.0, 1.0, 3.0], num_layers=3)
    expected = _f64(
        [
            [0, 6 / 9, 0, 3 / 9],  # S_1 = {1, 3}, sum 9
            [2 / 11, 6 / 11, 0, 3 / 11],  # S_2 = {1, 3, 0}, sum 11
            [2 / 12, 6 / 12, 1 / 12, 3 / 12],  # S_3 = everyone, sum 12
        ]
    )
    assert weights.dtype == torch.float64
    assert torch.allclose(weights, expected, rtol=0, atol=1e-15)
    assert torch.allclose(weights.sum(dim=1), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-15)


def test_depthwise_reverse_uses_every_client_at_the_input_side() -> None:
    # Reverse: M_j = ceil((3 - j + 1)/3 * 4): 4, 3, 2, i.e. the rows of the forward case upside down.
    weights = depthwise_fisher_weights([2.0, 6.0, 1.0, 3.0], num_layers=3, reverse=True)
    expected = _f64([[2 / 12, 6 / 12, 1 / 12, 3 / 12], [2 / 11, 6 / 11, 0, 3 / 11], [0, 6 / 9, 0, 3 / 9]])
    assert torch.allclose(weights, expected, rtol=0, atol=1e-15)


def test_depthwise_ties_go_to_the_lower_client_index() -> None:
    # Traces 1, 3, 3, 2 and four layers: M_j = j. Clients 1 and 2 tie at 3; client 1 comes first.
    weights = depthwise_fisher_weights(torch.tensor([1.0, 3.0, 3.0, 2.0]), num_layers=4)
    expected = _f64(
        [
            [0, 1, 0, 0],
            [0, 3 / 6, 3 / 6, 0],
            [0, 3 / 8, 3 / 8, 2 / 8],
            [1 / 9, 3 / 9, 3 / 9, 2 / 9],
        ]
    )
    assert torch.allclose(weights, expected, rtol=0, atol=1e-15)


def test_depthwise_zero_traces_get_zero_weight_but_may_be_selected() -> None:
    # Traces 0, 4, 0 and two layers: M_j = ceil(j/2 * 3) = 2, 3. Client 1 carries all the weight in both.
    weights = depthwise_fisher_weights([0.0, 4.0, 0.0], num_layers=2)
    assert torch.equal(weights, _f64([[0, 1, 0], [0, 1, 0]]))


def test_depthwise_counts_are_exact_integers() -> None:
    # The spec's example: 5 hospitals, 9 shared units -> ceil(5j/9) = 1, 2, 2, 3, 3, 4, 4, 5, 5.
    assert depthwise_top_counts(9, 5) == [1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert depthwise_top_counts(9, 5, reverse=True) == [5, 5, 4, 4, 3, 3, 2, 2, 1]
    # In floats 7/25*25 = 7.000000000000001, whose ceil would be 8; M_j must be j here.
    assert depthwise_top_counts(25, 25) == list(range(1, 26))
    assert depthwise_top_counts(1, 3) == [3]


@pytest.mark.parametrize("traces", [[1.0, -0.5], [1.0, math.nan], [math.inf, 1.0]])
def test_depthwise_rejects_negative_or_non_finite_traces(traces: list[float]) -> None:
    with pytest.raises(FederationError, match="finite and >= 0"):
        depthwise_fisher_weights(traces, num_layers=2)


def test_depthwise_rejects_an_all_zero_selection_and_bad_sizes() -> None:
    with pytest.raises(FederationError, match=r"Eq\. 2 is undefined"):
        depthwise_fisher_weights([0.0, 0.0, 0.0], num_layers=2)
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        depthwise_fisher_weights([1.0, 2.0], num_layers=0)
    with pytest.raises(ValueError, match="at least one"):
        depthwise_fisher_weights([], num_layers=2)


# --- paper 002: FedLWS shrinking factors ----------------------------------------------------------------------------

# Three clients, three layers of 3, 2 and 2 values.
PREVIOUS = _f64([3, 0, 4, 0, 0, 0, 2])
CLIENTS = _f64(
    [
        [4, 0, 4, 1, 2, 2, 2],
        [3, 2, 4, 0, 0, 0, 4],
        [5, 1, 4, -1, 1, 0, 2],
    ]
)
LAYERS = (slice(0, 3), slice(3, 5), slice(5, 7))
# The strategy's aggregate with unequal weights 1/2, 1/4, 1/4.
AGGREGATE = 0.5 * CLIENTS[0] + 0.25 * CLIENTS[1] + 0.25 * CLIENTS[2]


def test_lws_spread_is_the_unweighted_mean_distance_from_the_mean_pseudo_gradient() -> None:
    # Layer 1: g = [1,0,0], [0,2,0], [2,1,0]; mean [1,1,0]; distances 1, sqrt(2), 1 -> (2 + sqrt 2)/3 = 1.1380712
    # Layer 2: g = [1,2], [0,0], [-1,1]; mean [0,1]; distances sqrt 2, 1, 1 -> (2 + sqrt 2)/3 as well
    # Layer 3: g = [2,0], [0,2], [0,0]; mean [2/3,2/3]; distances sqrt(20)/3, sqrt(20)/3, sqrt(8)/3
    #          -> (2 sqrt 20 + sqrt 8)/9 = 1.3080777
    tau = lws_spread(PREVIOUS, CLIENTS, LAYERS)
    expected = _f64([(2 + math.sqrt(2)) / 3, (2 + math.sqrt(2)) / 3, (2 * math.sqrt(20) + math.sqrt(8)) / 9])
    assert torch.allclose(tau, expected, rtol=0, atol=1e-14)
    assert tau[0].item() == pytest.approx(1.1380712, abs=1e-7)
    assert tau[2].item() == pytest.approx(1.3080777, abs=1e-7)


def test_lws_factors_on_unequal_clients_and_weights() -> None:
    beta = 0.1
    gamma = lws_factors(PREVIOUS, CLIENTS, AGGREGATE, LAYERS, beta)
    # Layer 1: ||w|| = 5; w_hat = [4, 0.75, 4], w_hat - w = [1, 0.75, 0] -> 1.25;
    #          gamma = 5 / (0.1 * 1.1380712 * 1.25 + 5) = 5 / 5.1422589 = 0.9723353
    # Layer 2: ||w|| = 0 -> gamma = 1 (it would otherwise be zeroed for ever)
    # Layer 3: ||w|| = 2; w_hat = [1, 2.5], w_hat - w = [1, 0.5] -> sqrt(1.25) = 1.1180340;
    #          gamma = 2 / (0.1 * 1.3080777 * 1.1180340 + 2) = 2 / 2.1462475 = 0.9318590
    tau1 = (2 + math.sqrt(2)) / 3
    tau3 = (2 * math.sqrt(20) + math.sqrt(8)) / 9
    expected = _f64([5 / (beta * tau1 * 1.25 + 5), 1.0, 2 / (beta * tau3 * math.sqrt(1.25) + 2)])
    assert torch.allclose(gamma, expected, rtol=0, atol=1e-14)
    assert gamma[0].item() == pytest.approx(0.9723353, abs=1e-7)
    assert gamma[2].item() == pytest.approx(0.9318590, abs=1e-7)


def test_lws_factor_is_one_without_disagreement_or_without_a_step() -> None:
    same = PREVIOUS.unsqueeze(0).repeat(3, 1) + _f64([1, 0, 0, 0, 0, 0, 0])  # every client moved alike: tau = 0
    gamma = lws_factors(PREVIOUS, same, same[0], LAYERS, beta=0.5)
    assert torch.equal(gamma, torch.ones(3, dtype=torch.float64))
    gamma = lws_factors(PREVIOUS, CLIENTS, PREVIOUS, LAYERS, beta=0.5)  # aggregate == previous: no step
    assert torch.equal(gamma, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("beta", [0.0, -0.01, math.nan, math.inf])
def test_lws_rejects_a_beta_that_is_not_positive(beta: float) -> None:
    with pytest.raises(FederationError, match="beta must be a finite number > 0"):
        lws_factors(PREVIOUS, CLIENTS, AGGREGATE, LAYERS, beta)


def test_lws_rejects_mismatched_shapes_and_empty_layers() -> None:
    with pytest.raises(ValueError, match="flat"):
        lws_factors(PREVIOUS[:6], CLIENTS, AGGREGATE, LAYERS, 0.1)
    with pytest.raises(ValueError, match="non-empty slice"):
        lws_factors(PREVIOUS, CLIENTS, AGGREGATE, [slice(2, 2)], 0.1)


# --- paper 003: FedTLU scores ---------------------------------------------------------------------------------------


def test_tlu_scores_use_the_population_std() -> None:
    update = _f64([1, 2, 3, 2, 2, 0, 0, 3, -1])
    scores = tlu_scores(update, [slice(0, 3), slice(3, 5), slice(5, 7), slice(7, 9)])
    # [1,2,3]: ||.|| = sqrt 14, sqrt n = sqrt 3, population std = sqrt(2/3) -> sqrt 14 / sqrt 2 = sqrt 7 = 2.6457513
    # [2,2]: std 0, non-zero -> +inf;  [0,0]: no movement -> 0
    # [3,-1]: ||.|| = sqrt 10, sqrt 2, population std 2 -> sqrt(10/8) = 1.1180340 (the sample std, 2 sqrt 2,
    #         would give 0.7905694 < 1, which the population form never does)
    assert scores[0].item() == pytest.approx(math.sqrt(7), abs=1e-14)
    assert scores[1].item() == math.inf
    assert scores[2].item() == 0.0
    assert scores[3].item() == pytest.approx(math.sqrt(1.25), abs=1e-14)
    assert scores[0].item() == pytest.approx(2.6457513, abs=1e-7)


def test_tlu_scores_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="flat"):
        tlu_scores(torch.zeros(2, 2), [slice(0, 2)])
    with pytest.raises(ValueError, match="non-empty slice"):
        tlu_scores(torch.zeros(4), [slice(3, 1)])


# --- paper 004: precision-weighted sum ------------------------------------------------------------------------------

W = _f64([[1, 2, 5], [3, 0, 1], [0, 4, 2]])
V = _f64([[1, 0, 0], [3, 1, 0], [0, 3, 0]])


def test_precision_weighted_sum_weights_each_value_by_inverse_second_moment() -> None:
    out = precision_weighted_sum(W, V, eps=1.0)
    # value 0: 1/(v+1) = 1/2, 1/4, 1 (sum 7/4) -> pi = 2/7, 1/7, 4/7 -> 2/7 + 3/7 + 0 = 5/7
    # value 1: 1/(v+1) = 1, 1/2, 1/4 (sum 7/4) -> pi = 4/7, 2/7, 1/7 -> 8/7 + 0 + 4/7 = 12/7
    # value 2: every v is 0 -> equal weights 1/3 -> (5 + 1 + 2)/3 = 8/3
    assert torch.allclose(out, _f64([5 / 7, 12 / 7, 8 / 3]), rtol=0, atol=1e-15)


def test_precision_weighted_sum_falls_back_where_no_client_has_a_second_moment() -> None:
    out = precision_weighted_sum(W, V, eps=1.0, fallback=[0.5, 0.25, 0.25])
    # value 2 only: 0.5*5 + 0.25*1 + 0.25*2 = 3.25; values 0 and 1 as above
    assert torch.allclose(out, _f64([5 / 7, 12 / 7, 3.25]), rtol=0, atol=1e-15)


def test_precision_weighted_sum_direct_reading_weights_by_second_moment() -> None:
    out = precision_weighted_sum(W, V, eps=1.0, inverse=False)
    # value 0: v+1 = 2, 4, 1 (sum 7) -> 2/7 + 12/7 + 0 = 2;  value 1: 1, 2, 4 -> 2/7 + 0 + 16/7 = 18/7
    assert torch.allclose(out, _f64([2, 18 / 7, 8 / 3]), rtol=0, atol=1e-15)


def test_precision_weighted_sum_keeps_the_vectors_dtype() -> None:
    out = precision_weighted_sum(W.float(), V.float(), eps=1.0)
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.tensor([5 / 7, 12 / 7, 8 / 3]), atol=1e-6)


def test_precision_weighted_sum_rejects_bad_input() -> None:
    with pytest.raises(FederationError, match="eps > 0"):
        precision_weighted_sum(W, V, eps=0.0)
    with pytest.raises(FederationError, match="finite and >= 0"):
        precision_weighted_sum(W, -V, eps=1e-7)
    with pytest.raises(FederationError, match="finite and >= 0"):
        precision_weighted_sum(W, V * math.nan, eps=1e-7)
    with pytest.raises(ValueError, match="do not match"):
        precision_weighted_sum(W, V[:, :2], eps=1e-7)
    with pytest.raises(ValueError, match="fallback"):
        precision_weighted_sum(W, V, eps=1e-7, fallback=[1.0, 0.0])


def test_lws_layers_may_overlap_or_leave_values_out() -> None:
    # The same layer twice (overlapping), and a layer of values 0-1 only (value 2 of layer 1 left out):
    # g = [1,0], [0,2], [2,1]; mean [1,1]; distances 1, sqrt 2, 1 -> (2 + sqrt 2)/3, as for the whole layer 1
    # because the left-out value moved alike for every client.
    tau = lws_spread(PREVIOUS, CLIENTS, [slice(0, 3), slice(0, 3), slice(0, 2)])
    assert torch.allclose(tau, torch.full((3,), (2 + math.sqrt(2)) / 3, dtype=torch.float64), rtol=0, atol=1e-14)


def test_lws_factors_take_a_precomputed_spread() -> None:
    tau = lws_spread(PREVIOUS, CLIENTS, LAYERS)
    direct = lws_factors(PREVIOUS, CLIENTS, AGGREGATE, LAYERS, 0.1)
    assert torch.equal(lws_factors(PREVIOUS, CLIENTS, AGGREGATE, LAYERS, 0.1, spread=tau), direct)
    with pytest.raises(ValueError, match="spread has shape"):
        lws_factors(PREVIOUS, CLIENTS, AGGREGATE, LAYERS, 0.1, spread=tau[:2])
