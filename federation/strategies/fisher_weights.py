"""Fisher reweighting (FedSAF, Miao et al., 2025; paper 001, Eq. 14 and 19-20), shared by FedSAF and FedAS, and the
check of the clients' Fisher traces that depth-wise FIM (paper 000) uses too: pure functions.

``gamma_i = tFIM_i / sum_n tFIM_n`` (Eq. 14, ``fisher_weights``) and ``p_i = gamma_i z_i + sum_{j != i} gamma_j z_j``
(Eq. 20, ``fisher_intermediate``). Written out, Eq. 20 gives every client the *same* ``p`` (``sum_j gamma_j z_j``);
it is implemented as written (see ``fisher_intermediate``) and documented so. A FedSAF round mixes that one row
with AMP's in ``amp_aggregate`` (`federation.strategies.amp`); FedAS (`federation.strategies.fedas`) averages with
``gamma`` alone; ``server.max_weight`` caps gamma afterwards (`federation.strategies.aggregation.cap_weights`). The
hospitals compute the traces (`federation.hospital.fisher`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from federation.errors import FederationError
from federation.strategies.aggregation import _check_matrix, mix


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
