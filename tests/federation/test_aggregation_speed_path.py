"""The server's one-pass AMP step (``amp_aggregate``, ``StackBuffer``, views from ``unflatten``) against a
straightforward reference: FedSAF paper 001, Eq. 3-8 (distances), 16 (xi), 18 (z_i), 14 and 20 (gamma, p_i).

The reference is written the slow, obvious way: a Python loop over client pairs for ``d_ij`` and ``xi_ij``, one
weighted sum per client for ``z_i`` and Eq. 20 term by term for ``p_i``, all in float64. The clients are unequal
(different vectors, sizes of differences, Fisher traces), never identical. Speed is measured in
benchmarks/aggregation_speed.py, not here.
"""

from __future__ import annotations

import math

import pytest
import torch
from support.checks import every

from federation.strategies.aggregation import mix
from federation.strategies.amp import amp_aggregate, amp_coefficients, pairwise_distances
from federation.strategies.context import StrategyContext
from federation.strategies.fedsaf import AmpSettings, AttentiveStrategy
from federation.strategies.fisher_weights import fisher_intermediate
from federation.strategies.flat import FlatSpec, StackBuffer, flatten, unflatten
from federation.wire.contract import Recipe, TrainReply

METRICS = ("euclidean", "manhattan", "cosine", "cosine_distance")


def _clients(m: int = 4, d: int = 7, seed: int = 0) -> torch.Tensor:
    """Unequal float64 clients around a common offset (like models grown from one initialisation)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(1, d, generator=g, dtype=torch.float64)
    spread = torch.tensor([0.1, 0.3, 0.7, 1.5, 0.2, 0.9][:m], dtype=torch.float64).unsqueeze(1)
    return base + spread * torch.randn(m, d, generator=g, dtype=torch.float64)


def _reference_distance(a: torch.Tensor, b: torch.Tensor, metric: str) -> float:
    if metric == "euclidean":
        return float(((a - b) ** 2).sum())  # Eq. 3-4, squared
    if metric == "manhattan":
        return float((a - b).abs().sum())  # Eq. 5-6
    cos = float((a * b).sum()) / (math.sqrt(float((a * a).sum())) * math.sqrt(float((b * b).sum())) + 1e-8)
    return cos if metric == "cosine" else 1.0 - cos  # Eq. 7-8 literally, or 1 - similarity


def _weighted(weights: list[float], rows: list[torch.Tensor]) -> torch.Tensor:
    """``sum_j weights_j rows_j``, one term at a time."""
    total = torch.zeros_like(rows[0])
    for w, row in zip(weights, rows, strict=True):
        total = total + w * row
    return total


def _reference(
    rho: torch.Tensor,
    metric: str,
    alpha_k: float,
    sigma: float,
    scale: str,
    gamma: list[float] | None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(d, xi, mixed rows of ``values``, default ``rho``) by loops: z_i for every client, or Eq. 20's p_i."""
    m, d = rho.shape
    dist = torch.zeros(m, m, dtype=torch.float64)
    for i in range(m):
        for j in range(m):
            dist[i, j] = _reference_distance(rho[i], rho[j], metric) if i != j else 0.0
    if metric == "cosine":
        for i in range(m):
            dist[i, i] = _reference_distance(rho[i], rho[i], metric)
    elif scale == "per_value" and metric != "cosine_distance":
        dist = dist / d
    elif scale == "relative":
        dist = dist / (sum(float(dist[i, j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1)))
    xi = torch.zeros(m, m, dtype=torch.float64)
    for i in range(m):
        for j in range(m):
            if i != j:
                xi[i, j] = alpha_k * math.exp(-float(dist[i, j]) / sigma) / sigma  # Eq. 3-8
        xi[i, i] = 1.0 - sum(float(xi[i, j]) for j in range(m) if j != i)  # Eq. 16
    rows = list(rho if values is None else values)
    z = [_weighted(xi[i].tolist(), rows) for i in range(m)]  # Eq. 18
    if gamma is None:
        return dist, xi, z
    # Eq. 20 term by term: p_i = gamma_i z_i + sum_{j != i} gamma_j z_j
    p = [gamma[i] * z[i] + _weighted([gamma[j] for j in range(m) if j != i], z[:i] + z[i + 1 :]) for i in range(m)]
    return dist, xi, p


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("scale", ["raw", "per_value", "relative"])
@pytest.mark.parametrize("fim", [False, True])
def test_amp_aggregate_equals_the_loop_reference(metric: str, scale: str, fim: bool) -> None:
    rho = _clients()
    extra = _clients(d=3, seed=1) ** 2  # e.g. running variances: mixed, never in the distances
    alpha_k, sigma = 0.2, 1.0
    traces = [2.0, 1.0, 5.0, 0.5]
    gamma = [t / sum(traces) for t in traces] if fim else None
    dist, xi, rows = _reference(rho, metric, alpha_k, sigma, scale, gamma)
    _, _, rows_extra = _reference(rho, metric, alpha_k, sigma, scale, gamma, values=extra)
    out = amp_aggregate(
        rho.clone(),
        metric,
        alpha_k,
        sigma,
        scale,
        extra=extra,
        gamma=None if gamma is None else torch.tensor(gamma, dtype=torch.float64),
    )
    assert torch.allclose(out.distances, dist, rtol=1e-12, atol=1e-14)
    assert torch.allclose(out.xi, xi, rtol=1e-12, atol=1e-14)
    # With FIM, Eq. 20 gives every client the same p: one row is mixed.
    expected = torch.stack(rows[:1] if fim else rows)
    expected_extra = torch.stack(rows_extra[:1] if fim else rows_extra)
    assert out.mixed.shape == expected.shape
    assert torch.allclose(out.mixed, expected, rtol=1e-12, atol=1e-12)
    assert out.mixed_extra is not None
    assert torch.allclose(out.mixed_extra, expected_extra, rtol=1e-12, atol=1e-12)
    if fim:
        assert every(torch.allclose(r, rows[0], rtol=1e-12, atol=1e-12) for r in rows)


@pytest.mark.parametrize("metric", METRICS)
def test_amp_aggregate_equals_the_public_functions_on_float32_models(metric: str) -> None:
    # Model-like float32 vectors: 50,000 values, clients within ~1e-3 of one another and unequally far apart.
    g = torch.Generator().manual_seed(3)
    base = torch.randn(1, 50_000, generator=g)
    rho = base + 1e-3 * torch.tensor([[0.5], [1.0], [1.5], [3.0], [0.7]]) * torch.randn(5, 50_000, generator=g)
    gamma = torch.tensor([0.4, 0.1, 0.2, 0.25, 0.05], dtype=torch.float64)
    sigma = 1.0 if metric != "cosine" else 10.0
    alpha_k = 0.2 if metric != "cosine" else 2.0
    before = rho.clone()
    xi = amp_coefficients(rho, metric, alpha_k, sigma, scale="relative")
    out = amp_aggregate(rho, metric, alpha_k, sigma, "relative")
    kept = amp_aggregate(rho, metric, alpha_k, sigma, "relative", gamma=gamma)
    assert torch.equal(rho, before)  # the vectors are left as they were
    exact = pairwise_distances(rho.double(), metric, scale="relative")
    off = ~torch.eye(5, dtype=torch.bool)
    if metric == "euclidean":
        # the same centred Gram matrix as pairwise_distances: identical numbers
        assert torch.equal(out.distances, pairwise_distances(rho, metric, scale="relative"))
        assert torch.equal(out.xi, xi)
    gap = 1 - exact if metric == "cosine" else exact  # cosine: compare 1 - similarity, where the information is
    got = 1 - out.distances if metric == "cosine" else out.distances
    assert torch.allclose(got[off], gap[off], rtol=1e-4)
    assert torch.allclose(out.xi, xi, rtol=1e-5, atol=0)
    assert torch.allclose(out.mixed, mix(rho, xi), rtol=1e-5, atol=1e-6)
    p = fisher_intermediate(mix(rho, xi), gamma)
    assert kept.mixed.shape == (1, 50_000)
    assert torch.allclose(kept.mixed[0], p[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("fim", [False, True])
def test_overwrite_centres_the_vectors_on_client_0_and_gives_the_same_result(metric: str, fim: bool) -> None:
    rho = _clients(m=5, d=9, seed=4)
    before = rho.clone()
    gamma = torch.tensor([0.4, 0.1, 0.2, 0.25, 0.05], dtype=torch.float64) if fim else None
    alpha_k = 0.2 if metric != "cosine" else 0.05
    kept = amp_aggregate(rho, metric, alpha_k, 1.0, "relative", gamma=gamma)
    assert torch.equal(rho, before)  # overwrite=False leaves the vectors as they were
    scratch = rho.clone()
    used = amp_aggregate(scratch, metric, alpha_k, 1.0, "relative", gamma=gamma, overwrite=True)
    if metric != "euclidean":
        assert torch.equal(scratch, before)  # L1 needs no centring; cosine needs the vectors themselves
    else:
        assert torch.equal(scratch[0], before[0])  # rho_0 stays, the others become rho_j - rho_0
        assert torch.allclose(scratch[1:], before[1:] - before[0], rtol=0, atol=1e-15)
    assert torch.allclose(used.distances, kept.distances, rtol=1e-12, atol=1e-14)
    assert torch.allclose(used.xi, kept.xi, rtol=1e-12, atol=1e-14)
    assert torch.allclose(used.mixed, kept.mixed, rtol=1e-12, atol=1e-12)


def test_a_near_zero_vector_gets_its_cosine_similarities_from_its_own_values() -> None:
    # Client 2 is nearly the zero vector: its norm comes from the vector itself, not from the centred sums.
    rho = _clients(m=4, d=6, seed=8)
    rho[2] = 1e-6 * rho[1]
    out = amp_aggregate(rho.clone(), "cosine_distance", 0.2, 1.0, overwrite=True)
    assert torch.equal(out.distances, pairwise_distances(rho, "cosine_distance"))
    for j in (0, 1, 3):
        reference = 1.0 - _reference_distance(rho[2], rho[j], "cosine")
        assert float(out.distances[2, j]) == pytest.approx(reference, rel=1e-9)


def test_a_zero_vector_has_cosine_similarity_zero_with_everything() -> None:
    rho = _clients(m=3, d=5, seed=5)
    rho[1] = 0.0
    sim = pairwise_distances(rho, "cosine")
    assert sim[1].tolist() == [0.0, 0.0, 0.0]
    assert sim[:, 1].tolist() == [0.0, 0.0, 0.0]
    expected = _reference_distance(rho[0], rho[2], "cosine")
    assert float(sim[0, 2]) == pytest.approx(expected, rel=1e-12)
    out = amp_aggregate(rho.clone(), "cosine", 0.5, 1.0, overwrite=True)
    assert torch.equal(out.distances, sim)


def _state(values: list[float], mean: list[float], batches: int) -> dict[str, torch.Tensor]:
    return {
        "0.weight": torch.tensor(values[:4], dtype=torch.float32).reshape(2, 2),
        "0.bias": torch.tensor(values[4:6], dtype=torch.float32),
        "0.running_mean": torch.tensor(mean, dtype=torch.float32),
        "0.num_batches_tracked": torch.tensor(batches),
    }


def test_stack_buffer_equals_flatten_and_is_reused_with_fewer_rows() -> None:
    states = [
        _state([1, 2, 3, 4, 5, 6], [0.5, 1.5], 7),
        _state([0, -1, 2, 8, 1, 1], [2.0, -1.0], 3),
        _state([3, 3, 0, 1, 0, 2], [0.0, 4.0], 12),
    ]
    spec = FlatSpec.of(states[0])
    buffer = StackBuffer(spec, rows=3)
    assert torch.equal(buffer.stack(states), flatten(states, spec))
    first = buffer.stack(states)
    first.zero_()  # the caller may overwrite what it got ...
    assert torch.equal(buffer.stack(states[1:]), flatten(states[1:], spec))  # ... the next call rewrites it
    assert flatten(states, spec).dtype == torch.float32
    with pytest.raises(ValueError, match="4 state dicts for a stack buffer of 3 rows"):
        buffer.stack(states + states[:1])
    with pytest.raises(KeyError, match=r"0\.bias"):
        buffer.stack([{k: v for k, v in states[0].items() if k != "0.bias"}])


def test_unflatten_views_share_the_row_and_round_integers() -> None:
    state = _state([1, 2, 3, 4, 5, 6], [0.5, 1.5], 7)
    spec = FlatSpec.of(state)
    row = flatten([state], spec)[0]
    row[-1] = 6.6  # a mixed batch counter
    views = unflatten(row, spec, copy=False)
    copies = unflatten(row, spec)
    assert list(views) == list(spec.keys) == list(copies)
    for key in spec.keys:
        assert torch.equal(views[key], copies[key])
        assert views[key].dtype == copies[key].dtype == state[key].dtype
    assert int(views["0.num_batches_tracked"]) == 7
    row[0] = 100.0
    assert float(views["0.weight"][0, 0]) == 100.0  # a view of the row
    assert float(copies["0.weight"][0, 0]) == 1.0  # a copy


# -- the strategy as the engine calls it -------------------------------------------------------------------------------

UNITS = (("0", ["0.weight", "0.bias", "0.running_mean", "0.num_batches_tracked"]), ("1", ["1.weight"]))
PARAMS = {"0.weight", "0.bias", "1.weight"}
CLIENT_VALUES = [
    ([1.0, 0.0, 2.0, 1.0, 0.5, -0.5], [0.1, 0.2], 10),
    ([0.0, 1.0, 2.0, 3.0, 0.0, 1.0], [0.4, -0.2], 13),
    ([2.0, 2.0, 0.0, 1.0, 1.0, 1.0], [1.0, 0.0], 30),
    ([1.5, 0.5, 1.0, 2.5, -1.0, 0.0], [0.0, 0.3], 4),
]
TRACES = [2.0, 1.0, 5.0, 0.5]


def _strategy(metric: str, fim: bool) -> AttentiveStrategy:
    initial = {**_state([0.0] * 6, [0.0, 0.0], 0), "1.weight": torch.ones(2, 2)}
    ctx = StrategyContext(
        hospitals=(0, 1, 2, 3),
        num_examples={0: 10, 1: 30, 2: 60, 3: 5},
        state_keys=tuple(initial),
        units=UNITS,
        initial_state=initial,
    )
    amp = AmpSettings(alpha_k=0.3, sigma=1.0, lam=0.5, dm=metric, scale="relative")
    recipe = Recipe(epochs=1, lr=0.1, head_epochs=1, prox_mu=amp.prox_mu, fisher_batch=4 if fim else 0)
    return AttentiveStrategy("fedsaf", amp=amp, nhead=1, fim=fim, recipe=recipe, ctx=ctx, param_keys=PARAMS)


def _replies(clients: list[int], shift: float = 0.0) -> dict[int, TrainReply]:
    out = {}
    for c in clients:
        values, mean, batches = CLIENT_VALUES[c]
        shared = _state([v + shift * (c + 1) for v in values], mean, batches)
        out[c] = TrainReply(client=c, shared=shared, num_examples=5, metrics={"fisher_trace": TRACES[c]})
    return out


def _expected_centres(
    metric: str, fim: bool, replies: dict[int, TrainReply]
) -> tuple[torch.Tensor, dict[int, dict[str, torch.Tensor]]]:
    """xi and every client's centre from the loop reference, on the trainable parameters only (the distances) and
    every shared value (the mix); the integer batch counter rounded back."""
    clients = sorted(replies)
    params = ["0.weight", "0.bias"]
    rho = torch.stack([torch.cat([replies[c].shared[k].double().reshape(-1) for k in params]) for c in clients])
    everything = torch.stack(
        [torch.cat([replies[c].shared[k].double().reshape(-1) for k in (*params, "0.running_mean")]) for c in clients]
    )
    counters = torch.tensor([[float(replies[c].shared["0.num_batches_tracked"])] for c in clients], dtype=torch.float64)
    traces = [TRACES[c] for c in clients]
    gamma = [t / sum(traces) for t in traces] if fim else None
    xi = _reference(rho, metric, 0.3, 1.0, "relative", gamma)[1]
    mixed = _reference(rho, metric, 0.3, 1.0, "relative", gamma, values=torch.cat([everything, counters], dim=1))[2]
    centres = {}
    for i, c in enumerate(clients):
        row = mixed[i]
        centres[c] = {
            "0.weight": row[0:4].reshape(2, 2),
            "0.bias": row[4:6],
            "0.running_mean": row[6:8],
            "0.num_batches_tracked": torch.tensor(round(float(row[8]))),
        }
    return xi, centres


def _assert_centre(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(got) == ["0.weight", "0.bias", "0.running_mean", "0.num_batches_tracked"]  # state_dict order
    for key, value in expected.items():
        assert got[key].dtype == (torch.int64 if key.endswith("tracked") else torch.float32)
        assert torch.allclose(got[key].double(), value.double(), rtol=1e-6, atol=1e-6), key


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("fim", [False, True])
def test_strategy_round_equals_the_reference(metric: str, fim: bool) -> None:
    strategy = _strategy(metric, fim)
    replies = _replies([0, 1, 2, 3])
    record = strategy.aggregate_train(2, replies)
    xi, centres = _expected_centres(metric, fim, replies)
    assert torch.allclose(torch.tensor(record["xi"], dtype=torch.float64), xi, rtol=1e-6, atol=1e-7)
    plan = strategy.configure_train(3, [0, 1, 2, 3])
    for c in range(4):
        shared = plan[c].shared
        assert shared is not None
        _assert_centre(shared, centres[c])
    if fim:
        assert every(plan[c].shared is plan[0].shared for c in range(4))  # Eq. 20: one p for everyone


def test_a_client_left_out_keeps_its_centre_whatever_later_rounds_mix() -> None:
    strategy = _strategy("euclidean", fim=False)
    replies = _replies([0, 1, 2, 3])
    strategy.aggregate_train(2, replies)
    _, centres = _expected_centres("euclidean", False, replies)
    # client 3 does not reply in the next two rounds; the others move
    for server_round, shift in ((3, 0.5), (4, -0.25)):
        later = _replies([0, 1, 2], shift=shift)
        strategy.aggregate_train(server_round, later)
        _, now = _expected_centres("euclidean", False, later)
        plan = strategy.configure_train(server_round + 1, [0, 1, 2, 3])
        for c in range(3):
            shared = plan[c].shared
            assert shared is not None
            _assert_centre(shared, now[c])
        kept = plan[3].shared
        assert kept is not None
        _assert_centre(kept, centres[3])
        # its own copy, not a view that would keep round 2's whole matrix of every client alive
        weight = kept["0.weight"]
        assert weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
