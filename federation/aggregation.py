"""Aggregation maths: pure functions over stacked flat tensors ``(m clients x d values)``.

Implements FedSAF (Miao et al., 2025; paper 001) server-side aggregation, as fixed in DESIGN.md
("FedSAF, as implemented"):

- Attentive Message Passing (AMP), Eq. 3-8 and 16-18 (after FedAMP, Huang et al., AAAI 2021):
  ``xi_ij = alpha_k * A'(d_ij)`` for ``i != j`` with ``A(x) = 1 - exp(-x / sigma)`` (Eq. 10), so
  ``A'(x) = exp(-x / sigma) / sigma``; ``xi_ii = 1 - sum_{j != i} xi_ij`` (Eq. 16);
  ``z_i = sum_j xi_ij rho_j`` (Eq. 18). Row ``i`` of the returned matrix holds the weights of client ``i``'s
  intermediate model, so every row sums to 1 and ``Z = xi @ rho`` gives all intermediate models at once.
  The distance ``d_ij`` depends on ``dm``: ``euclidean`` = squared L2 (Eq. 3-4), ``manhattan`` = L1 (Eq. 5-6),
  ``cosine`` = the paper's Eq. 7-8, i.e. the cosine *similarity* fed to ``A'`` (so *more* similar clients get
  *less* weight, which is why the paper found it poor), and ``cosine_distance`` = 1 - cosine similarity
  (the natural reading, offered beside the literal one).
- Fisher reweighting, Eq. 14 and 19-20: ``gamma_i = tFIM_i / sum_n tFIM_n`` and
  ``p_i = gamma_i z_i + sum_{j != i} gamma_j z_j``. Written out, Eq. 20 gives every client the *same* ``p``
  (``sum_j gamma_j z_j``); it is implemented as written (see ``fisher_intermediate``) and documented so.
- Weighted sums (FedAvg's ``sum_i n_i / n * w_i`` and the batched ``coefficients @ vectors``).
- The seed methods (``../shared/reference/seed-methods.md``; docs/methods.md): depth-wise Fisher weights
  (paper 000, Eq. 1-3, ``depthwise_fisher_weights``), FedLWS shrinking factors (paper 002, Eq. 4, 7-9,
  ``lws_factors``), FedTLU layer scores (paper 003, Sec. 3, ``tlu_scores``) and precision-weighted averaging
  (paper 004, Eq. 6, ``precision_weighted_sum``).

Everything is vectorised: pairwise distances come from one Gram matrix (or ``torch.cdist`` for L1); there is
no Python loop over client pairs. Distances and mixes run in the precision of the vectors (float32 for model
weights, where the centred Gram matrix keeps distances to ~1e-4 relative; float64 in the hand-checked tests);
the small coefficient matrices are float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

import torch

from federation.errors import FederationError

Metric = Literal["euclidean", "manhattan", "cosine", "cosine_distance"]
METRICS: tuple[str, ...] = ("euclidean", "manhattan", "cosine", "cosine_distance")
# How d_ij is scaled before A' (a departure from the paper, which uses "raw"; see docs/fedsaf.md):
# "raw" = as Eq. 3-8; "per_value" = divided by the number of values d (mean squared / absolute difference);
# "relative" = divided by the mean off-diagonal distance of the round, so sigma is in units of that mean.
SCALES: tuple[str, ...] = ("raw", "per_value", "relative")

# Eq. 7-8 add 1e-8 to the product of the norms so that an all-zero vector does not divide by zero.
COSINE_EPS = 1e-8


def _check_matrix(vectors: torch.Tensor) -> None:
    if vectors.dim() != 2 or vectors.shape[0] < 1:
        raise ValueError(f"expected stacked flat vectors of shape (m clients, d values), got {tuple(vectors.shape)}")


def _work_dtype(vectors: torch.Tensor) -> torch.dtype:
    """Distances and mixes run in the vectors' own precision (float32 for models, float64 in exact tests)."""
    return vectors.dtype if vectors.dtype in (torch.float32, torch.float64) else torch.float32


def _squared_distances(vectors: torch.Tensor) -> torch.Tensor:
    """``||v_i - v_j||^2`` for all pairs (float64 result) from one Gram matrix of the *centred* vectors.

    Squared distances are translation-invariant: centring each value over the clients first keeps the identity
    ``||a-b||^2 = |a|^2 + |b|^2 - 2 a.b`` well conditioned when the clients are close to each other (uncentred,
    float32 rounding of |a|^2 would swamp their small differences).
    """
    v = vectors.detach().to(_work_dtype(vectors))
    v = v - v.mean(dim=0, keepdim=True)
    gram = (v @ v.T).to(torch.float64)
    sq = gram.diagonal()
    dist = (sq.unsqueeze(1) + sq.unsqueeze(0) - 2.0 * gram).clamp_min(0.0)
    dist.fill_diagonal_(0.0)
    return dist


def _cosine_similarity(vectors: torch.Tensor) -> torch.Tensor:
    """Eq. 7-8: ``rho_i . rho_j / (||rho_i|| ||rho_j|| + 1e-8)`` (float64), accurate for nearly parallel vectors.

    Models grown from one initialisation have similarities within 1e-4 of 1, below float32's resolution of a
    direct dot product over 10^6 values. So the similarity is taken as ``1 - ||u_i - u_j||^2 / 2`` on the unit
    vectors ``u = rho / ||rho||`` (norms accumulated in float64; distances from the centred Gram matrix), then
    scaled by ``n_i n_j / (n_i n_j + 1e-8)`` to keep the paper's epsilon exactly.
    """
    v = vectors.detach().to(_work_dtype(vectors))
    norms = torch.linalg.vector_norm(v, dim=1, dtype=torch.float64)
    units = v / norms.clamp_min(torch.finfo(torch.float64).tiny).unsqueeze(1).to(v.dtype)
    product = norms.unsqueeze(1) * norms.unsqueeze(0)
    sim = (1.0 - 0.5 * _squared_distances(units)) * product / (product + COSINE_EPS)
    zero = norms == 0  # a zero vector has similarity 0 with everything (Eq. 7's epsilon)
    sim[zero, :] = 0.0
    sim[:, zero] = 0.0
    return sim


def pairwise_distances(vectors: torch.Tensor, metric: str, scale: str = "raw") -> torch.Tensor:
    """``d_ij`` for every pair of rows of ``vectors`` (shape ``(m, d)``), as a float64 ``(m, m)`` matrix.

    ``euclidean``: ``||rho_i - rho_j||^2`` (squared, Eq. 3-4); ``manhattan``: ``||rho_i - rho_j||_1`` (Eq. 5-6);
    ``cosine``: ``rho_i . rho_j / (||rho_i|| ||rho_j|| + 1e-8)`` (Eq. 7-8, a similarity: 1 on the diagonal);
    ``cosine_distance``: ``1 -`` that.

    ``scale`` (not in the paper; ``raw`` is the paper): ``per_value`` divides the euclidean and manhattan
    distances by ``d`` (the mean squared / mean absolute difference per value), so that one ``sigma`` means the
    same thing for any model size or ``nhead``; ``relative`` divides any distance by the mean of its off-diagonal
    entries, so that ``sigma`` is in units of this round's typical distance. The literal ``cosine`` similarity is
    never rescaled (it is not a distance), nor is ``cosine_distance`` by ``per_value`` (it is scale-free).
    """
    _check_matrix(vectors)
    if metric not in METRICS:
        raise FederationError(f"unknown AMP distance dm={metric!r}: use one of {', '.join(METRICS)}")
    if scale not in SCALES:
        raise FederationError(f"unknown AMP distance scale {scale!r}: use one of {', '.join(SCALES)}")
    m, d = vectors.shape
    if metric == "manhattan":
        # cdist with p=1 sums |a - b| directly in C++: exact, and no (m x m x d) temporary.
        v = vectors.detach().to(_work_dtype(vectors)).unsqueeze(0)
        dist = torch.cdist(v, v, p=1.0).squeeze(0).to(torch.float64)
    elif metric == "euclidean":
        dist = _squared_distances(vectors)
    else:
        sim = _cosine_similarity(vectors)
        if metric == "cosine":
            return sim
        dist = 1.0 - sim
        dist.fill_diagonal_(0.0)
    if scale == "per_value" and metric != "cosine_distance" and d > 0:
        dist = dist / d
    elif scale == "relative" and m > 1:
        mean = dist.sum() / (m * (m - 1))
        if mean > 0:
            dist = dist / mean
    return dist


def attention_derivative(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """``A'(x) = exp(-x / sigma) / sigma``, the derivative of FedAMP's ``A(x) = 1 - exp(-x / sigma)`` (Eq. 10)."""
    return torch.exp(-x / sigma) / sigma


def check_amp_settings(num_clients: int, metric: str, alpha_k: float, sigma: float) -> None:
    """Reject settings that could give a client a negative self-weight ``xi_ii`` (Eq. 16).

    For a distance ``d >= 0``, ``A'(d) <= 1/sigma``, so ``xi_ii = 1 - sum_{j != i} alpha_k A'(d_ij)
    >= 1 - alpha_k (m - 1) / sigma``: the self-weight is guaranteed non-negative exactly when
    ``alpha_k (m - 1) <= sigma`` (DESIGN.md). The literal ``cosine`` metric feeds a *similarity* in ``[-1, 1]``,
    and a negative similarity pushes ``A'`` above ``1/sigma``; models grown from one initialisation are never
    anti-correlated in practice, so the same rule applies and ``amp_coefficients`` checks the actual
    self-weights of that metric at run time.
    """
    if metric not in METRICS:
        raise FederationError(f"unknown AMP distance dm={metric!r}: use one of {', '.join(METRICS)}")
    if not (math.isfinite(sigma) and sigma > 0):
        raise FederationError(f"amp.sigma must be a positive number, got {sigma}")
    if not (math.isfinite(alpha_k) and alpha_k > 0):
        raise FederationError(f"amp.alpha_k must be a positive number, got {alpha_k}")
    peers = num_clients - 1
    # A relative tolerance so that the documented boundary case alpha_k (m - 1) == sigma is accepted.
    if alpha_k * peers > sigma * (1.0 + 1e-12):
        raise FederationError(
            f"amp.alpha_k={alpha_k} with amp.sigma={sigma} and {num_clients} clients could make a client's "
            f"self-weight xi_ii negative (needs alpha_k * (m-1) <= sigma): set amp.alpha_k <= {sigma / peers:.6g} "
            "or raise amp.sigma"
        )


def amp_coefficients(
    vectors: torch.Tensor, metric: str, alpha_k: float, sigma: float, scale: str = "raw"
) -> torch.Tensor:
    """The AMP weight matrix ``xi`` (float64, ``(m, m)``) for the clients' shared vectors ``(m, d)``.

    ``xi_ij = alpha_k * A'(d_ij)`` for ``i != j`` (Eq. 3-8), ``xi_ii = 1 - sum_{j != i} xi_ij`` (Eq. 16);
    row ``i`` holds the weights of client ``i``'s intermediate model ``z_i = sum_j xi_ij rho_j`` (Eq. 18) and
    sums to 1. ``scale`` rescales ``d_ij`` first (``pairwise_distances``; ``raw`` is the paper).
    Raises ``FederationError`` for settings that could make a self-weight negative (``check_amp_settings``), and
    for the literal ``cosine`` metric when negative similarities actually make one negative.
    """
    _check_matrix(vectors)
    m = vectors.shape[0]
    check_amp_settings(m, metric, alpha_k, sigma)
    dist = pairwise_distances(vectors, metric, scale=scale)
    xi = alpha_k * attention_derivative(dist, sigma)
    xi.fill_diagonal_(0.0)
    xi.diagonal().copy_(1.0 - xi.sum(dim=1))
    negative = [i for i, w in enumerate(xi.diagonal().tolist()) if w < 0]
    if negative:
        raise FederationError(
            f"dm={metric}: negative similarities give client(s) {negative} a negative self-weight "
            f"({[round(xi[i, i].item(), 6) for i in negative]}) with amp.alpha_k={alpha_k}, amp.sigma={sigma}: "
            "use dm = cosine_distance, or lower amp.alpha_k"
        )
    return xi


def off_diagonal_mass(xi: torch.Tensor) -> float:
    """Mean over clients of the weight given to *other* clients (``sum_{j != i} xi_ij``, averaged over ``i``).

    Near 0 means AMP has degenerated to local training; the strategies warn below ``1e-3``.
    """
    m = xi.shape[0]
    if m < 2:
        return 0.0
    return float((xi.sum() - xi.diagonal().sum()) / m)


def fisher_weights(traces: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """``gamma_i = tFIM_i / sum_n tFIM_n`` (Eq. 14) as a float64 vector summing to 1.

    Traces must be finite and non-negative. If every trace is 0 (no client has any gradient signal) the
    weights fall back to uniform, since Eq. 14 is then undefined.
    """
    t = torch.as_tensor(traces, dtype=torch.float64).flatten()
    if t.numel() == 0:
        raise ValueError("fisher_weights needs at least one client's Fisher trace")
    bad = [i for i, v in enumerate(t.tolist()) if not (math.isfinite(v) and v >= 0.0)]
    if bad:
        raise FederationError(
            f"Fisher traces must be finite and >= 0; client(s) {bad} reported {[t[i].item() for i in bad]} "
            "(check that the client computes fisher_trace on finite logits, or switch fedsaf.fim off)"
        )
    total = t.sum()
    if total <= 0:
        return torch.full_like(t, 1.0 / t.numel())
    return t / total


def fisher_intermediate(z: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``p_i = gamma_i z_i + sum_{j != i} gamma_j z_j`` for every client (Eq. 20), shape ``(m, d)``.

    Written as the matrix ``G`` with ``G_ii = gamma_i`` (first term) and ``G_ij = gamma_j`` (second term), so
    ``P = G @ Z``. Both terms give column ``j`` the weight ``gamma_j``: every row of ``G`` is ``gamma`` and
    every client receives the same ``p`` (the Fisher-weighted mean of the ``z_j``). That is what the paper's
    equation says; it is implemented as written.
    """
    _check_matrix(z)
    m = z.shape[0]
    g = gamma.to(torch.float64).flatten()
    if g.numel() != m:
        raise ValueError(f"gamma has {g.numel()} entries for {m} clients")
    coeff = g.unsqueeze(0).expand(m, m).clone()  # off-diagonal: gamma_j
    coeff.diagonal().copy_(g)  # diagonal: gamma_i
    return mix(z, coeff)


def weighted_sum(vectors: torch.Tensor, weights: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """``sum_i weights_i * vectors_i`` (shape ``(d,)``), e.g. FedAvg with ``weights_i = n_i / n``.

    Computed in the precision of ``vectors``. Weights are used as given (not renormalised).
    """
    _check_matrix(vectors)
    w = torch.as_tensor(weights, dtype=torch.float64).flatten()
    if w.numel() != vectors.shape[0]:
        raise ValueError(f"{w.numel()} weights for {vectors.shape[0]} vectors")
    return mix(vectors, w.unsqueeze(0))[0]


def mix(vectors: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """Every client's weighted sum at once: ``coefficients @ vectors``, shape ``(k, d)`` for ``(k, m)`` weights.

    The batched form of ``weighted_sum``: with ``coefficients = xi`` it gives all ``z_i`` (Eq. 18).
    Computed and returned in the precision of ``vectors``.
    """
    _check_matrix(vectors)
    c = coefficients.to(torch.float64)
    if c.dim() != 2 or c.shape[1] != vectors.shape[0]:
        raise ValueError(f"coefficients of shape {tuple(c.shape)} cannot mix {vectors.shape[0]} vectors")
    work = _work_dtype(vectors)
    return (c.to(device=vectors.device, dtype=work) @ vectors.detach().to(work)).to(vectors.dtype)


@dataclass(frozen=True)
class FlatSpec:
    """How ``state_dict`` entries map to one flat vector: the keys in order, with their shapes and dtypes."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor], keys: Sequence[str] | None = None) -> FlatSpec:
        """The spec of ``state`` restricted to ``keys`` (default: all of its keys, in order)."""
        chosen = list(state.keys()) if keys is None else list(keys)
        missing = [k for k in chosen if k not in state]
        if missing:
            raise KeyError(f"state_dict has no entries {missing[:5]}")
        return cls(
            keys=tuple(chosen),
            shapes=tuple(tuple(state[k].shape) for k in chosen),
            dtypes=tuple(state[k].dtype for k in chosen),
        )

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def numel(self) -> int:
        """Total number of values, i.e. the ``state_dict`` numel of the entries this spec covers."""
        return sum(self.numels)


def flatten(states: Sequence[Mapping[str, torch.Tensor]], spec: FlatSpec) -> torch.Tensor:
    """Stack the ``spec.keys`` entries of each state dict into one float32 ``(m, d)`` matrix, in key order."""
    if not states:
        raise ValueError("flatten needs at least one state dict")
    rows = []
    for state in states:
        missing = [k for k in spec.keys if k not in state]
        if missing:
            raise KeyError(f"state dict lacks shared entries {missing[:5]}")
        rows.append(torch.cat([state[k].detach().reshape(-1).to(torch.float32) for k in spec.keys]))
    return torch.stack(rows)


def unflatten(vector: torch.Tensor, spec: FlatSpec) -> dict[str, torch.Tensor]:
    """The inverse of ``flatten`` for one row: a state dict keyed by ``spec.keys`` with the original shapes/dtypes.

    Integer entries (e.g. BatchNorm's ``num_batches_tracked``) are rounded back to integers.
    """
    if vector.dim() != 1 or vector.numel() != spec.numel:
        raise ValueError(f"vector of shape {tuple(vector.shape)} does not match {spec.numel} values")
    out: dict[str, torch.Tensor] = {}
    for key, shape, dtype, chunk in zip(
        spec.keys, spec.shapes, spec.dtypes, torch.split(vector, list(spec.numels)), strict=True
    ):
        value = chunk.reshape(shape)
        if not dtype.is_floating_point:
            value = value.round()
        out[key] = value.to(dtype).clone()
    return out


# --- Seed methods (papers 000, 002, 003, 004; ../shared/reference/seed-methods.md) -------------------------------


def _check_traces(traces: Sequence[float] | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(traces, dtype=torch.float64).flatten()
    if t.numel() == 0:
        raise ValueError("needs at least one client's Fisher trace")
    bad = [i for i, v in enumerate(t.tolist()) if not (math.isfinite(v) and v >= 0.0)]
    if bad:
        raise FederationError(
            f"Fisher traces must be finite and >= 0; client(s) {bad} reported {[t[i].item() for i in bad]} "
            "(check that the client computes fisher_trace on finite logits)"
        )
    return t


def depthwise_top_counts(num_layers: int, num_clients: int, reverse: bool = False) -> list[int]:
    """``M_j`` for ``j = 1 .. N`` (input side first): paper 000, Eq. 1, ``M_j = ceil(j / N * M)``.

    ``reverse`` is the paper's "Reverse" ablation, ``M_j = ceil((N - j + 1) / N * M)``: the input side then uses
    every client and the output side the fewest. Computed in integers (``ceil(a / b) = (a + b - 1) // b``) so
    that no float rounding moves a boundary.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    depths = range(num_layers, 0, -1) if reverse else range(1, num_layers + 1)
    return [(j * num_clients + num_layers - 1) // num_layers for j in depths]


def depthwise_fisher_weights(
    traces: Sequence[float] | torch.Tensor, num_layers: int, reverse: bool = False
) -> torch.Tensor:
    """Depth-wise Fisher aggregation weights (Nutaba & Watanabe, paper 000, Eq. 1-3), float64 ``(N, m)``.

    Row ``j`` (input side first, ``j = 1 .. N = num_layers``) holds each client's weight in layer ``j``:
    ``M_j = ceil(j / N * M)`` (Eq. 1; ``reverse``: ``ceil((N - j + 1) / N * M)``), ``S_j`` = the ``M_j`` clients
    with the largest Fisher traces ``alpha_i`` (ties go to the lower client index), and
    ``abar_ij = alpha_i / sum_{k in S_j} alpha_k`` for ``i in S_j``, 0 otherwise (Eq. 2, whose ``S_i`` in the
    denominator is read as the typo for ``S_j``). Eq. 3, ``theta_j^t + sum_i abar_ij (theta_ij^t - theta_j^t)``,
    then equals ``sum_i abar_ij theta_ij^t`` because each row sums to 1, so ``W[j] @ stacked_layer_j`` is the
    new layer. The deepest layer uses every client; the shallowest only the top one(s).

    Raises ``FederationError`` for a negative or non-finite trace, and when a layer's selected clients all
    have trace 0 (Eq. 2 is then undefined: no selected client carries any gradient signal).
    """
    t = _check_traces(traces)
    m = t.numel()
    counts = depthwise_top_counts(num_layers, m, reverse)
    # Descending trace, ties by ascending client index: a stable sort of the negated traces.
    order = torch.sort(-t, stable=True).indices
    weights = torch.zeros(num_layers, m, dtype=torch.float64)
    for j, count in enumerate(counts):
        chosen = order[:count]
        total = t[chosen].sum()
        if total <= 0:
            raise FederationError(
                f"depth-wise Fisher weights: the top {count} client(s) of layer {j + 1} all report a Fisher trace "
                "of 0, so Eq. 2 is undefined (no selected client has any gradient signal; check fisher_batch)"
            )
        weights[j, chosen] = t[chosen] / total
    return weights


def _check_slices(slices: Sequence[slice], d: int, what: str) -> list[tuple[int, int]]:
    bounds = []
    for i, s in enumerate(slices):
        start, stop, step = s.indices(d)
        if step != 1 or stop <= start:
            raise ValueError(f"{what} {i} is {s}: use a non-empty slice with step 1 within {d} values")
        bounds.append((start, stop))
    return bounds


def _segment_sums(values: torch.Tensor, bounds: Sequence[tuple[int, int]]) -> torch.Tensor:
    """Sums of ``values[..., a:b]`` for each ``(a, b)`` in ``bounds``, shape ``[..., L]``, in one pass when the
    segments do not overlap (a Python loop over a hundred layers costs more than the arithmetic)."""
    d = values.shape[-1]
    covered = sorted(bounds)
    if all(prev[1] <= nxt[0] for prev, nxt in pairwise(covered)):
        ids = torch.full((d,), len(bounds), dtype=torch.long)  # values outside every segment go to a spare slot
        for i, (a, b) in enumerate(bounds):
            ids[a:b] = i
        out = torch.zeros(*values.shape[:-1], len(bounds) + 1, dtype=values.dtype)
        return out.index_add_(-1, ids, values)[..., :-1]
    return torch.stack([values[..., a:b].sum(dim=-1) for a, b in bounds], dim=-1)


def lws_factors(
    previous: torch.Tensor,
    clients: torch.Tensor,
    aggregate: torch.Tensor,
    layers: Sequence[slice],
    beta: float,
    *,
    spread: torch.Tensor | None = None,
) -> torch.Tensor:
    """FedLWS layer-wise shrinking factors ``gamma_l`` (Shi et al., ICLR 2025; paper 002, Eq. 4, 7-8), float64 ``[L]``.

    ``previous`` is the global model ``w = w_g^t`` the clients started from (flat ``[d]``), ``clients`` their
    returned models ``w_k`` (``[K, d]``), ``aggregate`` the strategy's aggregate ``w_hat`` (``[d]``) and
    ``layers`` the slices of one layer each. Per layer ``l``: the pseudo-gradients ``g_kl = w_kl - w_l``, their
    *unweighted* mean ``gbar_l``, ``tau_l = (1/K) sum_k ||g_kl - gbar_l||_2`` (Eq. 4 per layer, Eq. 8) and

        ``gamma_l = ||w_l|| / (beta * tau_l * ||w_hat_l - w_l|| + ||w_l||)``          (Eq. 7-8)

    with ``gamma_l = 1`` when ``||w_l|| = 0`` (a layer that starts at zero, e.g. a zero-initialised bias, would
    otherwise be zeroed for ever). The new global layer is ``gamma_l * w_hat_l`` (Eq. 9). ``beta > 0``.
    ``spread``: the ``tau_l`` if already computed (``lws_spread``), so that a caller logging them pays once.
    """
    if not (math.isfinite(beta) and beta > 0):
        raise FederationError(f"FedLWS beta must be a finite number > 0, got {beta} (the paper's safe range 0.001-0.1)")
    _check_matrix(clients)
    d = clients.shape[1]
    if previous.shape != (d,) or aggregate.shape != (d,):
        raise ValueError(
            f"previous {tuple(previous.shape)} and aggregate {tuple(aggregate.shape)} must both be flat [{d}] vectors "
            "like the clients' rows"
        )
    bounds = _check_slices(layers, d, "layer")
    tau = lws_spread(previous, clients, layers) if spread is None else spread.to(torch.float64)
    if tau.shape != (len(bounds),):
        raise ValueError(f"spread has shape {tuple(tau.shape)} for {len(bounds)} layers")
    w = previous.detach().to(torch.float64)
    norm_w = _segment_sums(w.square(), bounds).sqrt()
    norm_step = _segment_sums((aggregate.detach().to(torch.float64) - w).square(), bounds).sqrt()
    shrunk = norm_w / (beta * tau * norm_step + norm_w)
    return torch.where(norm_w > 0, shrunk, torch.ones_like(norm_w))


def lws_spread(previous: torch.Tensor, clients: torch.Tensor, layers: Sequence[slice]) -> torch.Tensor:
    """``tau_l`` of paper 002, Eq. 8 (the mean distance of the clients' pseudo-gradients from their mean), ``[L]``.

    The same quantity ``lws_factors`` uses, exposed for logging.
    """
    _check_matrix(clients)
    if previous.shape != (clients.shape[1],):
        raise ValueError(f"previous {tuple(previous.shape)} must be a flat [{clients.shape[1]}] vector")
    bounds = _check_slices(layers, clients.shape[1], "layer")
    g = clients.detach().to(torch.float64) - previous.detach().to(torch.float64)
    # The mean over clients is taken value by value, so it can be taken once for the whole vector.
    deviation = g - g.mean(dim=0, keepdim=True)
    return _segment_sums(deviation.square(), bounds).sqrt().mean(dim=0)


def tlu_scores(update: torch.Tensor, tensors: Sequence[slice]) -> torch.Tensor:
    """FedTLU layer scores (Park & Joe-Wong, paper 003, Sec. 3 "Layer scoring"), float64 ``[T]``.

    For each parameter tensor ``i`` (a slice of the flat update ``Delta = w_hat - w^t``, ``n_i`` values):

        ``Score_i = ||Delta_i||_2 / (sqrt(n_i) * std(Delta_i))``

    with the *population* standard deviation, so ``Score_i = sqrt(1 + mean(Delta_i)^2 / var(Delta_i)) >= 1``:
    large when the tensor moved consistently in one direction. Where ``std = 0`` the ratio is undefined: a
    tensor that did not move scores 0 (never preferred), a non-zero constant update scores ``+inf`` (the limit
    of the formula: perfectly consistent).
    """
    if update.dim() != 1:
        raise ValueError(f"update must be a flat [d] vector, got shape {tuple(update.shape)}")
    bounds = _check_slices(tensors, update.numel(), "tensor")
    delta = update.detach().to(torch.float64)
    scores = torch.empty(len(bounds), dtype=torch.float64)
    for i, (start, stop) in enumerate(bounds):
        part = delta[start:stop]
        std = part.std(correction=0)
        norm = torch.linalg.vector_norm(part)
        if std > 0:
            scores[i] = norm / (math.sqrt(stop - start) * std)
        else:
            scores[i] = 0.0 if norm == 0 else math.inf
    return scores


def precision_weighted_sum(
    vectors: torch.Tensor,
    second_moments: torch.Tensor,
    eps: float,
    *,
    fallback: Sequence[float] | torch.Tensor | None = None,
    inverse: bool = True,
) -> torch.Tensor:
    """Precision-weighted aggregation (Reyes et al., paper 004, Eq. 6), element-wise, shape ``[d]``.

    ``vectors`` are the clients' weights ``w_k`` (``[K, d]``) and ``second_moments`` their bias-corrected Adam
    second moments ``v_hat_k`` (same shape, >= 0). For every value:

        ``pi_k = (v_hat_k + eps)^-1 / sum_j (v_hat_j + eps)^-1``,   ``w = sum_k pi_k w_k``        (Eq. 6)

    ``eps > 0`` keeps a zero second moment finite (Eq. 6 itself has none). Where *every* client's ``v_hat`` is
    exactly 0 (a frozen or unused parameter: there is no variance estimate at all), Eq. 6 would give uniform
    weights; ``fallback`` (e.g. ``n_k / n``) is used there instead when given.
    ``inverse=False`` is the alternative reading (weight by ``v_hat_k + eps``, Adam's ``v`` as the Fisher
    diagonal, i.e. the precision itself; the paper's Sec. 3 suggests it, Eq. 6 and Sec. 5.4 say inverse).
    Computed in float64, returned in the dtype of ``vectors``.
    """
    _check_matrix(vectors)
    if second_moments.shape != vectors.shape:
        raise ValueError(
            f"second moments of shape {tuple(second_moments.shape)} do not match the vectors {tuple(vectors.shape)}"
        )
    if not (math.isfinite(eps) and eps > 0):
        raise FederationError(f"precision weighting needs eps > 0 (finite), got {eps}")
    v = second_moments.detach().to(torch.float64)
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()):
        raise FederationError("second moments must be finite and >= 0 (Adam's exp_avg_sq, bias-corrected)")
    w = vectors.detach().to(torch.float64)
    raw = 1.0 / (v + eps) if inverse else v + eps
    pi = raw / raw.sum(dim=0, keepdim=True)
    if fallback is not None:
        f = torch.as_tensor(fallback, dtype=torch.float64).flatten()
        if f.numel() != w.shape[0]:
            raise ValueError(f"{f.numel()} fallback weights for {w.shape[0]} vectors")
        unused = (v == 0).all(dim=0)
        pi[:, unused] = f.unsqueeze(1)
    return (pi * w).sum(dim=0).to(vectors.dtype)
