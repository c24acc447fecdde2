"""Aggregation maths: pure functions over stacked flat tensors ``(m clients x d values)``.

Implements FedSAF (Miao et al., 2025; paper 001) server-side aggregation, as fixed in docs/design.md
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
- Weighted sums (FedAvg's ``sum_i n_i / n * w_i`` and the batched ``coefficients @ vectors``), and the cap on any
  one client's weight (``server.max_weight``, ``cap_weights``: water-filling, not from the papers), applied to every
  method's weights: ``n_i / n``, Fisher ``gamma``, AMP's off-diagonal ``xi``, the per-layer and per-value weights.
- Robust aggregation for the averaging methods (``server.robust``, off by default): norm bounding of the updates
  against the round's median norm (Sun et al., 2019; ``bound_update_norms``) and the coordinate-wise trimmed mean
  (Yin et al., 2018; ``trimmed_mean``).
- The seed methods (``../shared/reference/seed-methods.md``; docs/methods.md): depth-wise Fisher weights
  (paper 000, Eq. 1-3, ``depthwise_fisher_weights``), FedLWS shrinking factors (paper 002, Eq. 4, 7-9,
  ``lws_factors``), FedTLU layer scores (paper 003, Sec. 3, ``tlu_scores``) and precision-weighted averaging
  (paper 004, Eq. 6, ``precision_weighted_sum``).

Everything is vectorised: pairwise distances come from one Gram matrix of the centred vectors (or
``torch.nn.functional.pdist`` for L1); there is no Python loop over client pairs. Distances and mixes run in the
precision of the vectors (float32 for model weights, where the centred Gram matrix keeps distances to ~1e-4
relative; float64 in the hand-checked tests); the small coefficient matrices are float64. A server round uses
``amp_aggregate``: the distances once, ``xi`` from them and every mixed model in one matrix product, on a matrix
stacked once (``StackBuffer``; for the euclidean metric centred in place); ``unflatten(copy=False)`` hands the
rows back as views. Stacking and unstacking state dicts (``FlatSpec``, ``flatten``, ``StackBuffer``,
``unflatten``) live in `federation.strategies.flat` and are re-exported here under their old names.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

import torch

from federation.bounds import amp_bound_problem, max_weight_problem
from federation.errors import FederationError
from federation.strategies.flat import (
    FlatSpec as FlatSpec,  # re-exported: the old names; the flat views live in federation.strategies.flat
)
from federation.strategies.flat import StackBuffer as StackBuffer
from federation.strategies.flat import flatten as flatten
from federation.strategies.flat import unflatten as unflatten

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


@dataclass(frozen=True)
class _CentredGram:
    """``G = W W^T`` (float64) of the rows centred on the first one, ``w_i = v_i - mu`` with ``mu = v_0`` (so
    ``w_0 = 0``), ``mu`` itself and ``W mu`` (float64, only when asked for)."""

    gram: torch.Tensor
    mu: torch.Tensor
    mu_dot: torch.Tensor | None


def _centred_gram(v: torch.Tensor, with_mu_dot: bool, in_place: bool) -> _CentredGram:
    """The Gram matrix of the vectors centred on the first one; ``in_place`` centres rows 1.. of ``v`` itself.

    Squared distances are translation-invariant: centring every vector on a point among them first keeps the
    identity ``||a-b||^2 = |a|^2 + |b|^2 - 2 a.b`` well conditioned when the clients are close to each other
    (uncentred, float32 rounding of |a|^2 would swamp their small differences). The point is client 0's vector
    rather than the mean, which would cost one more read of every value, and row 0 (``mu``) stays as it is.
    """
    m, d = v.shape
    f64 = torch.float64
    gram = torch.zeros(m, m, dtype=f64, device=v.device)
    mu = v[0]
    mu_dot = torch.zeros(m, dtype=f64, device=v.device) if with_mu_dot else None
    if d == 0 or m == 1:
        return _CentredGram(gram, mu, mu_dot)
    w = v[1:].sub_(mu) if in_place else v[1:] - mu
    gram[1:, 1:] = (w @ w.T).to(f64)  # row and column 0 stay 0: w_0 = 0
    if mu_dot is not None:
        mu_dot[1:] = (w @ mu).to(f64)
    return _CentredGram(gram, mu, mu_dot)


def _squared_from_gram(gram: torch.Tensor) -> torch.Tensor:
    """``||w_i - w_j||^2 = G_ii + G_jj - 2 G_ij`` (float64) from the Gram matrix ``G`` of the centred vectors."""
    sq = gram.diagonal()
    dist = (sq.unsqueeze(1) + sq.unsqueeze(0) - 2.0 * gram).clamp_min(0.0)
    dist.fill_diagonal_(0.0)
    return dist


def _cosine_from_gram(v: torch.Tensor, centred: _CentredGram) -> torch.Tensor:
    """Eq. 7-8, ``rho_i . rho_j / (||rho_i|| ||rho_j|| + 1e-8)`` (float64), from the centred Gram matrix.

    With ``rho_i = mu + w_i`` (``w`` the rows centred on ``mu``, ``G = W W^T``, ``a_i = w_i . mu``, ``s = |mu|^2``):
    ``n_i^2 = ||rho_i||^2 = s + 2 a_i + G_ii`` and, for the unit vectors ``u_i = rho_i / n_i``,

        ``||u_i - u_j||^2 = s delta_ij^2 + 2 delta_ij (a_i/n_i - a_j/n_j) + G_ii/n_i^2 + G_jj/n_j^2 - 2 G_ij/(n_i n_j)``

    with ``delta_ij = 1/n_i - 1/n_j``; the similarity is ``1 - ||u_i - u_j||^2 / 2``, scaled by
    ``n_i n_j / (n_i n_j + 1e-8)`` to keep the paper's epsilon exactly. Models grown from one initialisation have
    similarities within 1e-4 of 1, below float32's resolution of a direct dot product over 10^6 values; here every
    term that carries the difference comes from the centred vectors, and the rest is float64 on ``(m, m)``
    values. Where ``||rho_i||^2`` is small against ``s`` these sums would cancel, so those rows' norms and
    similarities are taken directly from their float64 vectors (an all-zero vector, which has similarity 0 with
    everything, is one of them). ``v`` holds the vectors themselves (never centred in place).
    """
    f64 = torch.float64
    gram, mu, mu_dot = centred.gram, centred.mu, centred.mu_dot
    assert mu_dot is not None
    s = torch.linalg.vector_norm(mu, dtype=f64).square()
    extra = 2.0 * mu_dot + gram.diagonal()  # n_i^2 - s, from the small centred quantities only
    # Weak clients (rare: a near-zero shared part) get their norms and similarities from their own float64 values.
    weak = (s + extra <= 1e-2 * s).nonzero().flatten()
    originals = v[weak].to(f64) if weak.numel() else None
    if originals is not None:
        own = originals.square().sum(dim=1)
        extra[weak] = own - s
    n2 = (s + extra).clamp_min(0.0)
    if originals is not None:
        n2[weak] = own  # not s + (own - s): that would round own away
    norms = n2.sqrt()
    zero = norms == 0
    safe = torch.where(zero, torch.ones_like(norms), norms)
    ni, nj = safe.unsqueeze(1), safe.unsqueeze(0)
    # delta_ij = (n_j - n_i) / (n_i n_j) with n_j - n_i = (n_j^2 - n_i^2) / (n_i + n_j): no cancellation.
    delta = (extra.unsqueeze(0) - extra.unsqueeze(1)) / ((ni + nj) * ni * nj)
    b = mu_dot / safe
    sq = gram.diagonal() / safe.square()
    usq = s * delta.square() + 2.0 * delta * (b.unsqueeze(1) - b.unsqueeze(0))
    usq = (usq + sq.unsqueeze(1) + sq.unsqueeze(0) - 2.0 * gram / (ni * nj)).clamp_min(0.0)
    usq.fill_diagonal_(0.0)
    product = norms.unsqueeze(1) * norms.unsqueeze(0)
    sim = (1.0 - 0.5 * usq) * product / (product + COSINE_EPS)
    if originals is not None:
        direct = (originals @ v.to(f64).T) / (norms[weak].unsqueeze(1) * norms.unsqueeze(0) + COSINE_EPS)
        sim[weak, :] = direct
        sim[:, weak] = direct.T
    sim[zero, :] = 0.0  # a zero vector has similarity 0 with everything (Eq. 7's epsilon)
    sim[:, zero] = 0.0
    return sim


def _l1_distances(v: torch.Tensor) -> torch.Tensor:
    """``||rho_i - rho_j||_1`` (float64) for every pair: ``pdist`` sums ``|a - b|`` directly in C++ over the
    ``m(m-1)/2`` pairs once each (``cdist`` would compute both triangles, and accumulates less accurately)."""
    m = v.shape[0]
    dist = torch.zeros(m, m, dtype=torch.float64, device=v.device)
    if m > 1:
        upper = torch.nn.functional.pdist(v.contiguous(), p=1.0).to(torch.float64)
        i, j = torch.triu_indices(m, m, 1, device=v.device)
        dist[i, j] = upper
        dist[j, i] = upper
    return dist


def _raw_distances(v: torch.Tensor, metric: str, in_place: bool = False) -> torch.Tensor:
    """The metric on ``v`` (already in its work dtype) before ``scale``, float64 ``(m, m)``; ``in_place`` (for the
    euclidean metric only: the cosine metrics need the vectors themselves for near-zero ones) leaves ``v`` centred
    on its first row (``_centred_gram``), else ``v`` is not changed.

    Every metric but manhattan comes from one Gram matrix ``W W^T`` of the centred vectors (``_centred_gram``);
    the cosine metrics add ``W mu`` for the norms.
    """
    if metric == "manhattan":
        return _l1_distances(v)
    if in_place and metric != "euclidean":
        raise ValueError(f"dm={metric} needs the vectors themselves: only euclidean distances centre them in place")
    centred = _centred_gram(v, with_mu_dot=metric != "euclidean", in_place=in_place)
    if metric == "euclidean":
        return _squared_from_gram(centred.gram)
    sim = _cosine_from_gram(v, centred)
    if metric == "cosine":
        return sim
    dist = 1.0 - sim
    dist.fill_diagonal_(0.0)
    return dist


def _check_metric(metric: str, scale: str) -> None:
    if metric not in METRICS:
        raise FederationError(f"unknown AMP distance dm={metric!r}: use one of {', '.join(METRICS)}", key="amp.dm")
    if scale not in SCALES:
        raise FederationError(f"unknown AMP distance scale {scale!r}: use one of {', '.join(SCALES)}", key="amp.scale")


def _rescale(dist: torch.Tensor, metric: str, scale: str, d: int) -> torch.Tensor:
    m = dist.shape[0]
    if metric == "cosine":
        return dist  # a similarity, not a distance: never rescaled
    if scale == "per_value" and metric != "cosine_distance" and d > 0:
        return dist / d
    if scale == "relative" and m > 1:
        mean = dist.sum() / (m * (m - 1))
        if mean > 0:
            return dist / mean
    return dist


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
    _check_metric(metric, scale)
    v = vectors.detach().to(_work_dtype(vectors))
    return _rescale(_raw_distances(v, metric), metric, scale, vectors.shape[1])


def attention_derivative(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """``A'(x) = exp(-x / sigma) / sigma``, the derivative of FedAMP's ``A(x) = 1 - exp(-x / sigma)`` (Eq. 10)."""
    return torch.exp(-x / sigma) / sigma


def check_amp_settings(num_hospitals: int, metric: str, alpha_k: float, sigma: float) -> None:
    """Reject settings that could give a client a negative self-weight ``xi_ii`` (Eq. 16).

    For a distance ``d >= 0``, ``A'(d) <= 1/sigma``, so ``xi_ii = 1 - sum_{j != i} alpha_k A'(d_ij)
    >= 1 - alpha_k (m - 1) / sigma``: the self-weight is guaranteed non-negative exactly when
    ``alpha_k (m - 1) <= sigma`` (docs/design.md). The literal ``cosine`` metric feeds a *similarity* in ``[-1, 1]``,
    and a negative similarity pushes ``A'`` above ``1/sigma``; models grown from one initialisation are never
    anti-correlated in practice, so the same rule applies and ``amp_coefficients`` checks the actual
    self-weights of that metric at run time.
    """
    if metric not in METRICS:
        raise FederationError(f"unknown AMP distance dm={metric!r}: use one of {', '.join(METRICS)}", key="amp.dm")
    if not (math.isfinite(sigma) and sigma > 0):
        raise FederationError(f"amp.sigma must be a positive number, got {sigma}", key="amp.sigma")
    if not (math.isfinite(alpha_k) and alpha_k > 0):
        raise FederationError(f"amp.alpha_k must be a positive number, got {alpha_k}", key="amp.alpha_k")
    problem = amp_bound_problem(num_hospitals, alpha_k, sigma)  # the same rule as the dashboard's, torch-free
    if problem is not None:
        raise FederationError(problem, key="amp.alpha_k")  # the bound is on alpha_k for the given sigma


def amp_weights(
    distances: torch.Tensor, metric: str, alpha_k: float, sigma: float, *, max_weight: float | None = None
) -> torch.Tensor:
    """The AMP weight matrix ``xi`` (float64, ``(m, m)``) from the ``d_ij`` already computed (``pairwise_distances``).

    ``xi_ij = alpha_k * A'(d_ij)`` for ``i != j`` (Eq. 3-8), ``xi_ii = 1 - sum_{j != i} xi_ij`` (Eq. 16), so every
    row sums to 1. Raises ``FederationError`` for settings that could make a self-weight negative
    (``check_amp_settings``), and for the literal ``cosine`` metric when negative similarities actually make one
    negative.

    ``max_weight`` (``server.max_weight``, not in the paper): every off-diagonal ``xi_ij`` above it is lowered to
    it before Eq. 16, so what another client can weigh in ``z_i`` is bounded and the excess stays with client ``i``'s
    own model (its self-weight). ``None`` (the default) changes nothing.
    """
    check_amp_settings(distances.shape[0], metric, alpha_k, sigma)
    xi = alpha_k * attention_derivative(distances.to(torch.float64), sigma)
    if max_weight is not None:
        xi.clamp_(max=max_weight)
    xi.fill_diagonal_(0.0)
    xi.diagonal().copy_(1.0 - xi.sum(dim=1))
    if bool((xi.diagonal() < 0).any()):
        negative = [i for i, w in enumerate(xi.diagonal().tolist()) if w < 0]
        raise FederationError(
            f"dm={metric}: negative similarities give client(s) {negative} a negative self-weight "
            f"({[round(xi[i, i].item(), 6) for i in negative]}) with amp.alpha_k={alpha_k}, amp.sigma={sigma}: "
            "use dm = cosine_distance, or lower amp.alpha_k"
        )
    return xi


def amp_coefficients(
    vectors: torch.Tensor, metric: str, alpha_k: float, sigma: float, scale: str = "raw"
) -> torch.Tensor:
    """The AMP weight matrix ``xi`` (float64, ``(m, m)``) for the clients' shared vectors ``(m, d)``.

    ``xi_ij = alpha_k * A'(d_ij)`` for ``i != j`` (Eq. 3-8), ``xi_ii = 1 - sum_{j != i} xi_ij`` (Eq. 16);
    row ``i`` holds the weights of client ``i``'s intermediate model ``z_i = sum_j xi_ij rho_j`` (Eq. 18) and
    sums to 1. ``scale`` rescales ``d_ij`` first (``pairwise_distances``; ``raw`` is the paper).
    Raises ``FederationError`` for settings that could make a self-weight negative (``check_amp_settings``), and
    for the literal ``cosine`` metric when negative similarities actually make one negative.
    ``amp_aggregate`` computes ``xi`` and the mixed models together (the distances once, one copy of the vectors).
    """
    _check_matrix(vectors)
    check_amp_settings(vectors.shape[0], metric, alpha_k, sigma)
    return amp_weights(pairwise_distances(vectors, metric, scale=scale), metric, alpha_k, sigma)


@dataclass(frozen=True)
class AmpAggregate:
    """One round of AMP on the server (Eq. 3-8, 16-18, and Eq. 20 when Fisher weights are given).

    ``distances``: the (rescaled) ``d_ij`` fed to ``A'``, float64 ``(m, m)``; ``xi``: the AMP matrix, float64
    ``(m, m)``; ``coefficients``: the rows actually mixed, float64 ``(k, m)`` (``xi`` itself, ``k = m``, or the one
    row ``gamma^T xi`` of Eq. 20, ``k = 1``); ``mixed = coefficients @ vectors`` ``(k, d)`` and ``mixed_extra =
    coefficients @ extra`` (``None`` without ``extra``), in the dtype of their inputs.
    """

    distances: torch.Tensor
    xi: torch.Tensor
    coefficients: torch.Tensor
    mixed: torch.Tensor
    mixed_extra: torch.Tensor | None


def amp_aggregate(
    vectors: torch.Tensor,
    metric: str,
    alpha_k: float,
    sigma: float,
    scale: str = "raw",
    *,
    extra: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    overwrite: bool = False,
    max_weight: float | None = None,
) -> AmpAggregate:
    """The server's AMP step in one pass: ``d_ij`` once, ``xi`` from them, and every mixed model in one product.

    ``vectors`` ``(m, d)``: the clients' shared vectors ``rho_j`` that the distances compare (Eq. 3-8);
    ``extra`` ``(m, e)``: values mixed with the same weights that do not enter the distances (e.g. BatchNorm
    buffers). Without ``gamma``: ``z_i = sum_j xi_ij rho_j`` for every client (Eq. 18), ``k = m`` rows.
    With the Fisher weights ``gamma`` (Eq. 14): ``p_i = gamma_i z_i + sum_{j != i} gamma_j z_j`` (Eq. 20) is
    ``G @ xi @ rho`` with every row of ``G`` equal to ``gamma`` (``fisher_intermediate``), so every client gets the
    same ``p = (gamma^T xi) @ rho``: that one row is mixed (``k = 1``), one product instead of two.

    Equal to ``amp_coefficients`` + ``mix`` (+ ``fisher_intermediate``) up to float rounding, with less work:
    the distances come from one Gram matrix of the vectors centred on client 0's (L1 from ``pdist``), and the mix
    is one product. With ``overwrite=True`` and the euclidean metric the vectors are centred in place (``vectors``
    then holds ``rho_0`` and ``w_j = rho_j - rho_0``: pass a matrix you own, e.g. from ``StackBuffer``); since
    every row of the coefficients sums to 1 (Eq. 16), ``sum_j c_ij rho_j = rho_0 + sum_{j>0} c_ij w_j``: the mix
    is one product of the centred matrix with the coefficients whose column 0 is set to 1, and no ``(m, d)`` copy
    is made at all.

    ``max_weight`` (``server.max_weight``): ``xi``'s off-diagonal weights are capped (``amp_weights``), so no other
    client weighs more than ``max_weight`` in any ``z_i``. With ``gamma`` (pass it capped already, ``cap_weights``)
    no client weighs more than ``max_weight`` in the common ``p`` either, with no further cap: ``xi`` is symmetric
    (``d_ij = d_ji``, and the cap keeps it so) with rows summing to 1, so its columns do too and client ``j``'s
    weight ``sum_i gamma_i xi_ij`` is a weighted mean of the gammas, at most their largest. ``None`` changes nothing.
    """
    _check_matrix(vectors)
    m, d = vectors.shape
    check_amp_settings(m, metric, alpha_k, sigma)
    _check_metric(metric, scale)
    if extra is not None and (extra.dim() != 2 or extra.shape[0] != m):
        raise ValueError(f"extra values of shape {tuple(extra.shape)} do not match {m} clients")
    work = _work_dtype(vectors)
    in_place = overwrite and metric == "euclidean" and vectors.dtype == work
    v = vectors.detach().to(work)
    distances = _rescale(_raw_distances(v, metric, in_place=in_place), metric, scale, d)
    xi = amp_weights(distances, metric, alpha_k, sigma, max_weight=max_weight)
    if gamma is None:
        coefficients = xi
    else:
        g = gamma.to(torch.float64).flatten()
        if g.numel() != m:
            raise ValueError(f"gamma has {g.numel()} entries for {m} clients")
        coefficients = g.unsqueeze(0) @ xi
    c = coefficients.to(device=v.device, dtype=work)
    if in_place:
        c = c.clone()
        c[:, 0] = 1.0  # rho_0 + sum_{j>0} c_ij w_j: v holds rho_0 in row 0 and w_j below
    mixed = c @ v
    mixed_extra = None if extra is None else mix(extra, coefficients)
    return AmpAggregate(distances, xi, coefficients, mixed.to(vectors.dtype), mixed_extra)


def off_diagonal_mass(xi: torch.Tensor) -> float:
    """Mean over clients of the weight given to *other* clients (``sum_{j != i} xi_ij``, averaged over ``i``).

    Near 0 means AMP has degenerated to local training; the strategies warn below ``1e-3``.
    """
    m = xi.shape[0]
    if m < 2:
        return 0.0
    return float((xi.sum() - xi.diagonal().sum()) / m)


def _check_traces(traces: Sequence[float] | torch.Tensor, caller: str, remedy: str = "") -> torch.Tensor:
    """The clients' Fisher traces (``tFIM_i`` of Eq. 12-15; paper 000's ``alpha_i``) as a flat float64 tensor.

    Refuses an empty list (a ``ValueError`` naming ``caller``) and a negative or non-finite trace (a
    ``FederationError`` naming the clients, then ``remedy``: what else the caller's user can do about it).
    """
    t = torch.as_tensor(traces, dtype=torch.float64).flatten()
    if t.numel() == 0:
        raise ValueError(f"{caller} needs at least one client's Fisher trace")
    bad = [i for i, v in enumerate(t.tolist()) if not (math.isfinite(v) and v >= 0.0)]
    if bad:
        raise FederationError(
            f"Fisher traces must be finite and >= 0; client(s) {bad} reported {[t[i].item() for i in bad]} "
            f"(check that the client computes fisher_trace on finite logits{remedy})"
        )
    return t


def fisher_weights(traces: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """``gamma_i = tFIM_i / sum_n tFIM_n`` (Eq. 14) as a float64 vector summing to 1.

    Traces must be finite and non-negative. If every trace is 0 (no client has any gradient signal) the
    weights fall back to uniform, since Eq. 14 is then undefined. Nothing here bounds one client's share: a trace of
    1e30 against traces of 2 and 6 gives ``[1.0, 2e-30, 6e-30]``; ``server.max_weight`` caps gamma afterwards
    (``cap_weights``).
    """
    t = _check_traces(traces, "fisher_weights", remedy=", or switch fedsaf.fim off")
    total = t.sum()
    if total <= 0:
        return torch.full_like(t, 1.0 / t.numel())
    if not bool(torch.isfinite(total)):
        # finite traces whose sum overflows (1e308 and 1e308): the same ratios, taken relative to the largest
        t = t / t.max()
        total = t.sum()
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


def cap_weights(weights: Sequence[float] | torch.Tensor, max_weight: float) -> torch.Tensor:
    """The weights ``w`` (non-negative, summing to 1, e.g. FedAvg's ``n_i / n``) with none above ``max_weight``:
    float64, summing to 1 (``server.max_weight``; docs/federation.md, "Bounding a hospital's weight").

    Water-filling: every weight above the cap is set to the cap, and what they lose is spread over the others in
    proportion to their weights, ``w'_i = w_i (1 - c k) / sum_{j uncapped} w_j`` for ``k`` clients capped at
    ``c``; that can lift another weight over the cap, so it repeats until none is (at most ``m`` times). The
    uncapped clients keep their ratios. Weights already under the cap come back exactly as given (``max_weight = 1``
    changes nothing). Should every uncapped weight be 0, their share is spread evenly (proportions are undefined
    there). A cap below ``1/m`` cannot hold for ``m`` weights summing to 1: a ``FederationError``
    (`federation.bounds.max_weight_problem`); malformed weights are a ``ValueError``.

    ``weights`` is one vector ``(m,)`` or a matrix ``(m, d)`` whose every column is one set of ``m`` weights (the
    per-value weights of precision-weighted FL, the per-layer weights of depth-wise FIM): each column is capped on
    its own, all at once.

    Example: counts ``[1e9, 10, 30]`` give ``w ~ [1, 1e-8, 3e-8]``; with ``max_weight = 0.5`` the first is capped
    and the others share ``0.5`` as ``1 : 3``, so ``[0.5, 0.125, 0.375]``.
    """
    w = torch.as_tensor(weights, dtype=torch.float64).clone()
    vector = w.dim() == 1
    if vector:
        w = w.unsqueeze(1)
    if w.dim() != 2 or w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"cap_weights needs at least one client's weight, in a vector or matrix, got {tuple(w.shape)}")
    m = w.shape[0]
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float((w.sum(dim=0) - 1.0).abs().max()) > 1e-9:
        shown = w[:, 0].tolist() if vector else f"a {m} x {w.shape[1]} matrix"
        raise ValueError(f"cap_weights needs finite non-negative weights summing to 1, got {shown}")
    problem = max_weight_problem(m, max_weight)
    if problem is not None:
        raise FederationError(problem)
    capped = torch.zeros_like(w, dtype=torch.bool)
    out = w
    while True:
        over = ~capped & (out > max_weight)
        if not bool(over.any()):
            return out[:, 0] if vector else out
        capped |= over
        free = ~capped
        remaining = (1.0 - max_weight * capped.sum(dim=0).to(torch.float64)).clamp_min(0.0)
        mass = torch.where(free, w, 0.0).sum(dim=0)
        count = free.sum(dim=0).to(torch.float64)
        proportional = w * (remaining / torch.where(mass > 0.0, mass, 1.0))
        even = (remaining / count.clamp_min(1.0)).expand_as(w)
        out = torch.where(free, torch.where(mass > 0.0, proportional, even), max_weight)


@dataclass(frozen=True)
class NormBound:
    """What ``bound_update_norms`` did: the clipped vectors ``(m, d)`` (rows not clipped are the inputs
    themselves, bit for bit), every update's L2 norm ``||v_i - r||`` (float64 ``(m,)``), the round's median of
    them, the bound (``factor`` times the median) and which rows were clipped (bool ``(m,)``)."""

    vectors: torch.Tensor
    norms: torch.Tensor
    median: float
    bound: float
    clipped: torch.Tensor


def bound_update_norms(vectors: torch.Tensor, reference: torch.Tensor, factor: float) -> NormBound:
    """Norm bounding of the clients' updates (Sun et al., 2019, "Can you really backdoor federated learning?",
    Sec. 3: the server clips every update to an L2 norm of at most ``M``), with ``M`` the round's median update norm
    times ``factor`` (``server.robust = "norm_bound"``, ``server.norm_factor``).

    ``vectors`` ``(m, d)`` are the clients' returned values ``v_i``, ``reference`` ``(d,)`` the global model ``r``
    they started from; the update is ``u_i = v_i - r`` and

        ``M = factor * median_i ||u_i||_2``,   ``v'_i = r + u_i * min(1, M / ||u_i||_2)``

    (the median of an even number of norms is the mean of the middle two). Norms are float64; a row with
    ``||u_i|| <= M`` is returned as given, bit for bit. Any later weighting then averages bounded updates: with
    weights ``w_i`` summing to 1, one client moves the average by at most ``w_i (M + ||u_i^honest||)`` from where
    its honest update would have put it. The median is an honest client's norm only while more than half of the
    round's clients are honest; see docs/federation.md, "Robust aggregation", for what this does not cover.
    """
    _check_matrix(vectors)
    m, d = vectors.shape
    if reference.shape != (d,):
        raise ValueError(f"reference of shape {tuple(reference.shape)} for vectors of {d} values")
    if not (math.isfinite(factor) and factor > 0):
        raise FederationError(f"server.norm_factor must be a finite number > 0, got {factor}", key="server.norm_factor")
    ref = reference.detach().to(torch.float64)
    norms = torch.stack([torch.linalg.vector_norm(vectors[i].detach().to(torch.float64) - ref) for i in range(m)])
    median = float(statistics.median(norms.tolist()))
    bound = factor * median
    clipped = norms > bound
    out = vectors.detach().clone()
    for i in clipped.nonzero().flatten().tolist():
        scale = bound / float(norms[i])
        out[i] = (ref + (vectors[i].detach().to(torch.float64) - ref) * scale).to(vectors.dtype)
    return NormBound(out, norms, median, bound, clipped)


def trimmed_mean(vectors: torch.Tensor, trim: int) -> torch.Tensor:
    """The coordinate-wise trimmed mean (Yin et al., ICML 2018, "Byzantine-robust distributed learning: towards
    optimal statistical rates", Definition 2), shape ``(d,)``: for every value ``k`` (``d`` of them) the ``m``
    clients' values are sorted, the ``trim`` largest and ``trim`` smallest are dropped and the remaining
    ``m - 2 trim`` are averaged with equal weights (``server.robust = "trimmed_mean"``, ``server.trim``; Yin et al.'s
    ``beta = trim / m``). ``trim = 0`` is the plain mean; ``2 trim >= m`` leaves nothing (a ``ValueError``).
    Computed in the precision of ``vectors`` (float32 for models).
    """
    _check_matrix(vectors)
    m = vectors.shape[0]
    if trim < 0 or 2 * trim >= m:
        raise ValueError(f"a trimmed mean of {m} values cannot drop {trim} at each end: use 0 <= trim < {m}/2")
    work = vectors.detach().to(_work_dtype(vectors))
    ordered = torch.sort(work, dim=0).values
    return ordered[trim : m - trim].mean(dim=0).to(vectors.dtype)


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


# --- Seed methods (papers 000, 002, 003, 004; ../shared/reference/seed-methods.md) -------------------------------


def depthwise_top_counts(num_layers: int, num_hospitals: int, reverse: bool = False) -> list[int]:
    """``M_j`` for ``j = 1 .. N`` (input side first): paper 000, Eq. 1, ``M_j = ceil(j / N * M)``.

    ``reverse`` is the paper's "Reverse" ablation, ``M_j = ceil((N - j + 1) / N * M)``: the input side then uses
    every client and the output side the fewest. Computed in integers (``ceil(a / b) = (a + b - 1) // b``) so
    that no float rounding moves a boundary.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if num_hospitals < 1:
        raise ValueError(f"num_hospitals must be >= 1, got {num_hospitals}")
    depths = range(num_layers, 0, -1) if reverse else range(1, num_layers + 1)
    return [(j * num_hospitals + num_layers - 1) // num_layers for j in depths]


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
    t = _check_traces(traces, "depthwise_fisher_weights")
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
    pi = precision_weights(second_moments, eps, fallback=fallback, inverse=inverse)
    return (pi * vectors.detach().to(torch.float64)).sum(dim=0).to(vectors.dtype)


def precision_weights(
    second_moments: torch.Tensor,
    eps: float,
    *,
    fallback: Sequence[float] | torch.Tensor | None = None,
    inverse: bool = True,
) -> torch.Tensor:
    """The weights ``pi_k`` of paper 004, Eq. 6, for every value: float64 ``(K, d)``, each column summing to 1
    (``precision_weighted_sum``, which documents them; ``fallback`` fills the columns where every ``v_hat`` is 0).
    ``server.max_weight`` caps each column (``cap_weights``) before they are applied."""
    _check_matrix(second_moments)
    if not (math.isfinite(eps) and eps > 0):
        raise FederationError(f"precision weighting needs eps > 0 (finite), got {eps}")
    v = second_moments.detach().to(torch.float64)
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()):
        raise FederationError("second moments must be finite and >= 0 (Adam's exp_avg_sq, bias-corrected)")
    raw = 1.0 / (v + eps) if inverse else v + eps
    pi = raw / raw.sum(dim=0, keepdim=True)
    if fallback is not None:
        f = torch.as_tensor(fallback, dtype=torch.float64).flatten()
        if f.numel() != v.shape[0]:
            raise ValueError(f"{f.numel()} fallback weights for {v.shape[0]} vectors")
        unused = (v == 0).all(dim=0)
        pi[:, unused] = f.unsqueeze(1)
    return pi
