"""Attentive Message Passing (AMP), the server maths FedSAF and FedAMP share: pure functions over stacked flat
tensors ``(m clients x d values)``.

FedSAF (Miao et al., 2025; paper 001) server-side aggregation, as fixed in docs/design.md ("FedSAF, as implemented"),
Eq. 3-8 and 16-18 (after FedAMP, Huang et al., AAAI 2021):
``xi_ij = alpha_k * A'(d_ij)`` for ``i != j`` with ``A(x) = 1 - exp(-x / sigma)`` (Eq. 10), so
``A'(x) = exp(-x / sigma) / sigma``; ``xi_ii = 1 - sum_{j != i} xi_ij`` (Eq. 16);
``z_i = sum_j xi_ij rho_j`` (Eq. 18). Row ``i`` of the returned matrix holds the weights of client ``i``'s
intermediate model, so every row sums to 1 and ``Z = xi @ rho`` gives all intermediate models at once.
The distance ``d_ij`` depends on ``dm``: ``euclidean`` = squared L2 (Eq. 3-4), ``manhattan`` = L1 (Eq. 5-6),
``cosine`` = the paper's Eq. 7-8, i.e. the cosine *similarity* fed to ``A'`` (so *more* similar clients get
*less* weight, which is why the paper found it poor), and ``cosine_distance`` = 1 - cosine similarity
(the natural reading, offered beside the literal one). AMP's off-diagonal ``xi`` is capped at ``server.max_weight``
(``amp_weights``). With FedSAF's Fisher weights ``gamma`` (Eq. 14, 20; `federation.strategies.fisher_weights`)
``amp_aggregate`` mixes the one row ``gamma^T xi``. The strategies are `federation.strategies.fedsaf`
(``AttentiveStrategy``) and `federation.strategies.fedamp`.

Everything is vectorised: pairwise distances come from one Gram matrix of the centred vectors (or
``torch.nn.functional.pdist`` for L1); there is no Python loop over client pairs. Distances and mixes run in the
precision of the vectors (float32 for model weights, where the centred Gram matrix keeps distances to ~1e-4
relative; float64 in the hand-checked tests); the small coefficient matrices are float64. A server round uses
``amp_aggregate``: the distances once, ``xi`` from them and every mixed model in one matrix product, on a matrix
stacked once (``StackBuffer``; for the euclidean metric centred in place); ``unflatten(copy=False)`` hands the
rows back as views. Stacking and unstacking state dicts (``FlatSpec``, ``flatten``, ``StackBuffer``,
``unflatten``) live in `federation.strategies.flat`; the weighted sums and the weight cap all methods share in
`federation.strategies.aggregation`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from federation.bounds import amp_bound_problem
from federation.errors import FederationError
from federation.strategies.aggregation import _check_matrix, _work_dtype, mix

Metric = Literal["euclidean", "manhattan", "cosine", "cosine_distance"]
METRICS: tuple[str, ...] = ("euclidean", "manhattan", "cosine", "cosine_distance")
# How d_ij is scaled before A' (a departure from the paper, which uses "raw"; see docs/fedsaf.md):
# "raw" = as Eq. 3-8; "per_value" = divided by the number of values d (mean squared / absolute difference);
# "relative" = divided by the mean off-diagonal distance of the round, so sigma is in units of that mean.
SCALES: tuple[str, ...] = ("raw", "per_value", "relative")

# Eq. 7-8 add 1e-8 to the product of the norms so that an all-zero vector does not divide by zero.
COSINE_EPS = 1e-8


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
