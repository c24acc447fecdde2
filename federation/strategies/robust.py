"""Robust aggregation for the averaging methods (``server.robust``, off by default; `federation.strategies.fedavg`):
pure functions over stacked flat tensors ``(m clients x d values)``.

- Norm bounding of the updates against the round's median norm (Sun et al., 2019; ``bound_update_norms``,
  ``server.robust = "norm_bound"``), applied before any method's weighting.
- The coordinate-wise trimmed mean (Yin et al., 2018; ``trimmed_mean``, ``server.robust = "trimmed_mean"``), which
  replaces the ``n_i / n`` weighting of the example-weighted strategies.

docs/federation.md, "Robust aggregation", says what they do not cover; `federation.bounds.robust_problem` what they
need.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from federation.errors import FederationError
from federation.strategies.aggregation import _check_matrix, _work_dtype


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
