"""Shared aggregation primitives: pure functions over stacked flat tensors ``(m clients x d values)``.

Only what several methods' maths builds on is here:

- Weighted sums: FedAvg's ``sum_i n_i / n * w_i`` (``weighted_sum``) and the batched ``coefficients @ vectors``
  (``mix``: AMP's ``Z = xi @ rho``, FedSAF paper 001, Eq. 18, and the Fisher mix of Eq. 20).
- The cap on any one client's weight (``server.max_weight``, ``cap_weights``: water-filling, not from the papers),
  applied to every method's weights: ``n_i / n``, Fisher ``gamma``, AMP's off-diagonal ``xi``, the per-layer and
  per-value weights.
- The checks the methods share: a stacked ``(m, d)`` matrix (``_check_matrix``), the precision a mix runs in
  (``_work_dtype``: float32 for model weights, float64 in the hand-checked tests; the small coefficient matrices are
  float64) and the slices of one layer or tensor each (``_check_slices``, FedLWS's and FedTLU's).

Each method's own maths lives beside its strategy:

- Attentive Message Passing (FedSAF and FedAMP; paper 001, Eq. 3-8, 16-18): `federation.strategies.amp`.
- Fisher reweighting (paper 001, Eq. 14, 19-20; FedSAF and FedAS): `federation.strategies.fisher_weights`.
- Robust aggregation for the averaging methods (``server.robust``): `federation.strategies.robust`.
- The seed methods (``../shared/reference/seed-methods.md``; docs/methods.md): depth-wise Fisher weights (paper 000)
  in `federation.strategies.depthwise_fim`, FedLWS shrinking factors (paper 002) in
  `federation.strategies.wrappers.fedlws`, FedTLU layer scores (paper 003) in `federation.strategies.wrappers.fedtlu`
  and precision-weighted averaging (paper 004) in `federation.strategies.precision_weighted`.

Stacking and unstacking state dicts (``FlatSpec``, ``flatten``, ``StackBuffer``, ``unflatten``) is
`federation.strategies.flat`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from federation.bounds import max_weight_problem
from federation.errors import FederationError


def _check_matrix(vectors: torch.Tensor) -> None:
    if vectors.dim() != 2 or vectors.shape[0] < 1:
        raise ValueError(f"expected stacked flat vectors of shape (m clients, d values), got {tuple(vectors.shape)}")


def _work_dtype(vectors: torch.Tensor) -> torch.dtype:
    """Distances and mixes run in the vectors' own precision (float32 for models, float64 in exact tests)."""
    return vectors.dtype if vectors.dtype in (torch.float32, torch.float64) else torch.float32


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


def _check_slices(slices: Sequence[slice], d: int, what: str) -> list[tuple[int, int]]:
    bounds = []
    for i, s in enumerate(slices):
        start, stop, step = s.indices(d)
        if step != 1 or stop <= start:
            raise ValueError(f"{what} {i} is {s}: use a non-empty slice with step 1 within {d} values")
        bounds.append((start, stop))
    return bounds
