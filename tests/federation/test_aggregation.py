"""Exact-number tests of the AMP and Fisher aggregation maths (FedSAF paper Eq. 3-8, 14, 16-20).

Three unequal clients with four values each; every expected number is worked out by hand in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch

from federation.errors import FederationError
from federation.strategies.aggregation import mix, weighted_sum
from federation.strategies.amp import amp_coefficients, check_amp_settings, off_diagonal_mass, pairwise_distances
from federation.strategies.fisher_weights import fisher_intermediate, fisher_weights
from federation.strategies.flat import FlatSpec, flatten, unflatten

# rho_1, rho_2, rho_3: the three clients' shared vectors from the previous round.
RHO = torch.tensor(
    [
        [1.0, 0.0, 2.0, 1.0],
        [0.0, 1.0, 2.0, 3.0],
        [2.0, 2.0, 0.0, 1.0],
    ],
    dtype=torch.float64,
)
ALPHA = 2.0
SIGMA = 10.0
# alpha_k * A'(d) = alpha_k * exp(-d / sigma) / sigma = 0.2 * exp(-d / 10)
SCALE = ALPHA / SIGMA


def _weight(d: float) -> float:
    return SCALE * math.exp(-d / SIGMA)


def _expected_xi(d12: float, d13: float, d23: float) -> torch.Tensor:
    x12, x13, x23 = _weight(d12), _weight(d13), _weight(d23)
    return torch.tensor(
        [
            [1 - x12 - x13, x12, x13],
            [x12, 1 - x12 - x23, x23],
            [x13, x23, 1 - x13 - x23],
        ],
        dtype=torch.float64,
    )


def test_euclidean_xi_uses_squared_distance() -> None:
    # rho_1 - rho_2 = [1, -1, 0, -2] -> 1 + 1 + 0 + 4 = 6
    # rho_1 - rho_3 = [-1, -2, 2, 0] -> 1 + 4 + 4 + 0 = 9
    # rho_2 - rho_3 = [-2, -1, 2, 2] -> 4 + 1 + 4 + 4 = 13
    dist = pairwise_distances(RHO, "euclidean")
    assert torch.allclose(dist, torch.tensor([[0.0, 6, 9], [6, 0, 13], [9, 13, 0]], dtype=torch.float64), atol=1e-12)
    xi = amp_coefficients(RHO, "euclidean", ALPHA, SIGMA)
    # xi_12 = 0.2 e^-0.6 = 0.2 * 0.5488116 = 0.1097623; xi_13 = 0.2 e^-0.9 = 0.0813139; xi_23 = 0.2 e^-1.3 = 0.0545064
    # xi_11 = 1 - 0.1097623 - 0.0813139 = 0.8089237; xi_22 = 1 - 0.1097623 - 0.0545064 = 0.8357313
    # xi_33 = 1 - 0.0813139 - 0.0545064 = 0.8641797
    assert torch.allclose(xi, _expected_xi(6, 9, 13), atol=1e-12)
    assert xi[0, 1].item() == pytest.approx(0.1097623, abs=1e-7)
    assert xi[1, 2].item() == pytest.approx(0.0545064, abs=1e-7)
    assert xi[0, 0].item() == pytest.approx(0.8089237, abs=1e-7)
    assert xi[2, 2].item() == pytest.approx(0.8641797, abs=1e-7)


def test_manhattan_xi_uses_l1_distance() -> None:
    # |rho_1 - rho_2| = 1 + 1 + 0 + 2 = 4; |rho_1 - rho_3| = 1 + 2 + 2 + 0 = 5; |rho_2 - rho_3| = 2 + 1 + 2 + 2 = 7
    xi = amp_coefficients(RHO, "manhattan", ALPHA, SIGMA)
    # xi_12 = 0.2 e^-0.4 = 0.1340640; xi_13 = 0.2 e^-0.5 = 0.1213061; xi_23 = 0.2 e^-0.7 = 0.0993171
    # xi_11 = 1 - 0.1340640 - 0.1213061 = 0.7446299
    assert torch.allclose(xi, _expected_xi(4, 5, 7), atol=1e-12)
    assert xi[0, 1].item() == pytest.approx(0.1340640, abs=1e-7)
    assert xi[0, 0].item() == pytest.approx(0.7446299, abs=1e-7)


def test_cosine_xi_feeds_the_similarity_as_in_eq_7_8() -> None:
    # |rho_1|^2 = 1 + 0 + 4 + 1 = 6; |rho_2|^2 = 0 + 1 + 4 + 9 = 14; |rho_3|^2 = 4 + 4 + 0 + 1 = 9
    # rho_1.rho_2 = 0 + 0 + 4 + 3 = 7; rho_1.rho_3 = 2 + 0 + 0 + 1 = 3; rho_2.rho_3 = 0 + 2 + 0 + 3 = 5
    c12 = 7 / (math.sqrt(6 * 14) + 1e-8)  # 0.7637626
    c13 = 3 / (math.sqrt(6 * 9) + 1e-8)  # 0.4082483
    c23 = 5 / (math.sqrt(14 * 9) + 1e-8)  # 0.4454354
    xi = amp_coefficients(RHO, "cosine", ALPHA, SIGMA)
    assert torch.allclose(xi, _expected_xi(c12, c13, c23), atol=1e-12)
    # The most similar pair (1, 2) gets the *smallest* weight: 0.2 e^-0.07637626 = 0.1852935
    assert xi[0, 1].item() == pytest.approx(0.1852935, abs=1e-7)
    assert xi[0, 1] < xi[0, 2]


def test_cosine_distance_xi_feeds_one_minus_similarity() -> None:
    c12 = 7 / (math.sqrt(84) + 1e-8)
    c13 = 3 / (math.sqrt(54) + 1e-8)
    c23 = 5 / (math.sqrt(126) + 1e-8)
    xi = amp_coefficients(RHO, "cosine_distance", ALPHA, SIGMA)
    # xi_12 = 0.2 e^-(1 - 0.7637626)/10 = 0.2 e^-0.02362374 = 0.1953306: now the most similar pair gets the most
    assert torch.allclose(xi, _expected_xi(1 - c12, 1 - c13, 1 - c23), atol=1e-12)
    assert xi[0, 1].item() == pytest.approx(0.1953306, abs=1e-7)
    assert xi[0, 1] > xi[0, 2]


def test_per_value_scale_divides_by_the_number_of_values() -> None:
    # 4 values: squared distances 6, 9, 13 become 1.5, 2.25, 3.25; L1 distances 4, 5, 7 become 1, 1.25, 1.75
    xi = amp_coefficients(RHO, "euclidean", ALPHA, SIGMA, scale="per_value")
    assert torch.allclose(xi, _expected_xi(1.5, 2.25, 3.25), atol=1e-12)
    xi = amp_coefficients(RHO, "manhattan", ALPHA, SIGMA, scale="per_value")
    assert torch.allclose(xi, _expected_xi(1.0, 1.25, 1.75), atol=1e-12)
    # cosine values are scale-free: per_value leaves them unchanged
    for metric in ("cosine", "cosine_distance"):
        assert torch.equal(pairwise_distances(RHO, metric, scale="per_value"), pairwise_distances(RHO, metric))


def test_relative_scale_divides_by_the_mean_pairwise_distance() -> None:
    # euclidean: mean of 6, 9, 13 = 28 / 3, so d becomes 6 * 3/28 = 0.6428571, 9 * 3/28 = 0.9642857,
    # 13 * 3/28 = 1.3928571
    xi = amp_coefficients(RHO, "euclidean", ALPHA, SIGMA, scale="relative")
    assert torch.allclose(xi, _expected_xi(18 / 28, 27 / 28, 39 / 28), atol=1e-12)
    # manhattan: mean of 4, 5, 7 = 16 / 3 -> 0.75, 0.9375, 1.3125
    xi = amp_coefficients(RHO, "manhattan", ALPHA, SIGMA, scale="relative")
    assert torch.allclose(xi, _expected_xi(0.75, 0.9375, 1.3125), atol=1e-12)
    # the literal cosine similarity is not a distance and is never rescaled
    assert torch.equal(pairwise_distances(RHO, "cosine", scale="relative"), pairwise_distances(RHO, "cosine"))
    with pytest.raises(FederationError, match="unknown AMP distance scale"):
        pairwise_distances(RHO, "euclidean", scale="median")


@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "cosine", "cosine_distance"])
def test_rows_sum_to_one_and_self_weights_positive(metric: str) -> None:
    xi = amp_coefficients(RHO, metric, ALPHA, SIGMA)
    assert torch.allclose(xi.sum(dim=1), torch.ones(3, dtype=torch.float64), atol=1e-15)
    assert bool((xi.diagonal() > 0).all())


def test_intermediate_models_z() -> None:
    xi = _expected_xi(6, 9, 13)
    z = mix(RHO, xi)
    # z_1 = 0.8089237 [1,0,2,1] + 0.1097623 [0,1,2,3] + 0.0813139 [2,2,0,1]
    #     = [0.8089237 + 0.1626278, 0.1097623 + 0.1626278, 1.6178474 + 0.2195246, 0.8089237 + 0.3292869 + 0.0813139]
    #     = [0.9715515, 0.2723901, 1.8373720, 1.2195245]
    assert z[0].tolist() == pytest.approx([0.9715515, 0.2723901, 1.8373720, 1.2195245], abs=1e-6)
    # z_3 = 0.0813139 [1,0,2,1] + 0.0545064 [0,1,2,3] + 0.8641797 [2,2,0,1]
    #     = [0.0813139 + 1.7283594, 0.0545064 + 1.7283594, 0.1626278 + 0.1090128, 0.0813139 + 0.1635192 + 0.8641797]
    #     = [1.8096733, 1.7828658, 0.2716406, 1.1090128]
    assert z[2].tolist() == pytest.approx([1.8096733, 1.7828658, 0.2716406, 1.1090128], abs=1e-6)
    # the batched form equals one weighted_sum per client
    for i in range(3):
        assert torch.allclose(z[i], weighted_sum(RHO, xi[i]), atol=1e-15)


def test_fisher_weights_and_identical_p() -> None:
    # gamma = [2, 1, 5] / (2 + 1 + 5) = [0.25, 0.125, 0.625]
    gamma = fisher_weights([2.0, 1.0, 5.0])
    assert gamma.tolist() == [0.25, 0.125, 0.625]
    z = mix(RHO, _expected_xi(6, 9, 13))
    p = fisher_intermediate(z, gamma)
    # p_1 = gamma_1 z_1 + gamma_2 z_2 + gamma_3 z_3, first value:
    #     = 0.25 * 0.9715515 + 0.125 * 0.2187750 + 0.625 * 1.8096733
    #     = 0.2428879 + 0.0273469 + 1.1310458 = 1.4012806
    assert p[0, 0].item() == pytest.approx(1.4012806, abs=1e-6)
    # p_2 = gamma_2 z_2 + (gamma_1 z_1 + gamma_3 z_3): the same three terms, so the same value (Eq. 20)
    for i in range(3):
        assert torch.allclose(p[i], p[0], atol=1e-15)
    assert torch.allclose(p[0], weighted_sum(z, gamma), atol=1e-15)


def test_fisher_weights_rejects_bad_traces_and_handles_all_zero() -> None:
    with pytest.raises(FederationError, match=r"client\(s\) \[1\]"):
        fisher_weights([1.0, float("nan"), 2.0])
    with pytest.raises(FederationError, match="finite and >= 0"):
        fisher_weights([1.0, -0.5, 2.0])
    assert fisher_weights([0.0, 0.0, 0.0]).tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])


def test_settings_that_could_make_a_self_weight_negative_are_rejected() -> None:
    # m = 3: alpha_k (m - 1) <= sigma  <=>  alpha_k <= 5 for sigma = 10
    check_amp_settings(3, "euclidean", 5.0, 10.0)  # the boundary is allowed: xi_ii >= 0
    with pytest.raises(FederationError, match=r"alpha_k=6\.0 with amp.sigma=10\.0 and 3 hospitals.*alpha_k <= 5"):
        amp_coefficients(RHO, "euclidean", 6.0, 10.0)
    for args, key in (((3, "euclidean", 6.0, 10.0), "amp.alpha_k"), ((3, "l3", 1.0, 10.0), "amp.dm")):
        with pytest.raises(FederationError) as caught:
            check_amp_settings(*args)
        assert caught.value.key == key  # the dashboard puts the message on that field
    # the literal cosine similarity is not a distance: the same static rule, and a run-time check of the actual
    # self-weights. Clients 1 and 2 are opposed (similarity -1), client 3 is orthogonal to both (similarity 0):
    # xi_12 = 0.5 e^(1/10) = 0.5526, xi_13 = xi_23 = 0.5 e^0 = 0.5, so xi_11 = xi_22 = 1 - 1.0526 = -0.0526 < 0
    opposed = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    with pytest.raises(
        FederationError, match=r"client\(s\) \[0, 1\] a negative self-weight \(\[-0.052585, -0.052585\]"
    ):
        amp_coefficients(opposed, "cosine", 5.0, 10.0)
    with pytest.raises(FederationError, match="sigma must be a positive"):
        amp_coefficients(RHO, "manhattan", 1.0, 0.0)
    with pytest.raises(FederationError, match="unknown AMP distance"):
        amp_coefficients(RHO, "chebyshev", 1.0, 10.0)


def test_weighted_sum_with_unequal_weights() -> None:
    # FedAvg with n = [10, 30, 60]: 0.1 [1,0,2,1] + 0.3 [0,1,2,3] + 0.6 [2,2,0,1]
    #   = [0.1 + 1.2, 0.3 + 1.2, 0.2 + 0.6, 0.1 + 0.9 + 0.6] = [1.3, 1.5, 0.8, 1.6]
    out = weighted_sum(RHO.float(), [0.1, 0.3, 0.6])
    assert out.dtype == torch.float32
    assert out.tolist() == pytest.approx([1.3, 1.5, 0.8, 1.6], abs=1e-6)


def test_off_diagonal_mass() -> None:
    xi = _expected_xi(6, 9, 13)
    # (2 * (0.1097623 + 0.0813139 + 0.0545064)) / 3 = 0.4911652 / 3 = 0.1637217
    assert off_diagonal_mass(xi) == pytest.approx(0.1637217, abs=1e-6)
    assert off_diagonal_mass(torch.eye(3, dtype=torch.float64)) == 0.0


def test_flatten_unflatten_round_trip_keeps_shapes_and_dtypes() -> None:
    a = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([7.0]), "n": torch.tensor(4)}
    b = {"w": -torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1.5]), "n": torch.tensor(2)}
    spec = FlatSpec.of(a, ["w", "n", "b"])
    assert spec.numel == 6 + 1 + 1
    flat = flatten([a, b], spec)
    assert flat.shape == (2, 8)
    assert flat[1].tolist() == [0.0, -1.0, -2.0, -3.0, -4.0, -5.0, 2.0, 1.5]
    back = unflatten(flat[0], spec)
    assert list(back) == ["w", "n", "b"]
    assert torch.equal(back["w"], a["w"])
    assert back["n"].dtype == torch.int64
    assert int(back["n"]) == 4
    # mixing an integer counter rounds back to an integer: 0.5 * 4 + 0.5 * 2 = 3
    mixed = unflatten(weighted_sum(flat, [0.5, 0.5]), spec)
    assert int(mixed["n"]) == 3


def test_euclidean_distance_is_accurate_for_close_large_vectors() -> None:
    # Large, nearly equal vectors: the centred Gram matrix must not lose the small difference.
    base = torch.full((1, 100_000), 50.0)
    vectors = torch.cat([base, base + 1e-3, base - 2e-3])
    dist = pairwise_distances(vectors, "euclidean")
    # (1e-3)^2 * 1e5 = 0.1; (3e-3)^2 * 1e5 = 0.9; (2e-3)^2 * 1e5 = 0.4 (float32 inputs: ~1e-3 relative)
    assert dist[0, 1].item() == pytest.approx(0.1, rel=1e-2)
    assert dist[1, 2].item() == pytest.approx(0.9, rel=1e-2)
    assert dist[0, 2].item() == pytest.approx(0.4, rel=1e-2)


def test_cosine_distance_is_accurate_for_nearly_parallel_float32_vectors() -> None:
    # Model-like vectors: similarities within 1e-5 of 1, below float32's resolution of a plain dot product.
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 200_000, generator=g)
    vectors = base + 1e-3 * torch.randn(4, 200_000, generator=g)
    exact = pairwise_distances(vectors.double(), "cosine_distance")  # float64 reference, same formula
    fast = pairwise_distances(vectors, "cosine_distance")
    off = ~torch.eye(4, dtype=torch.bool)
    # 1 - cos ~ |noise|^2 / |base|^2 = (2 * 1e-6) / 2 / 1 = 1e-6 for each pair
    assert float(exact[off].min()) > 5e-7
    assert torch.allclose(fast[off], exact[off], rtol=1e-2)
    assert bool((fast >= 0).all())
