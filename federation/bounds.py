"""Rules on the aggregation weights that need the number of hospitals, written once and torch-free: the
configuration checks them when the hospitals are listed (`federation.config`), the dashboard before a run
(`app.dashboard.checks`), and the aggregation maths on every call (`federation.aggregation`), which thereby needs
nothing of the configuration package.

- `amp_bound_problem`: AMP's self-weight bound, FedSAF paper 001, Eq. 16 (``alpha_k (m - 1) <= sigma``).
- `max_weight_problem`: ``server.max_weight`` against ``1/m``.

Standard library only.
"""

from __future__ import annotations

import math


def amp_bound_problem(num_hospitals: int, alpha_k: float, sigma: float) -> str | None:
    """Why AMP with ``alpha_k`` and ``sigma`` could give one of ``num_hospitals`` hospitals a negative self-weight
    (Eq. 16), or ``None`` when it cannot.

    For a distance ``d >= 0``, ``A'(d) = exp(-d/sigma)/sigma <= 1/sigma``, so ``xi_ii >= 1 - alpha_k (m - 1) /
    sigma``: non-negative exactly when ``alpha_k (m - 1) <= sigma`` (docs/design.md). The boundary itself is allowed
    (a relative tolerance of 1e-12). The one rule: `federation.aggregation.check_amp_settings`, which the engine
    applies when a run starts, calls this; it needs no torch, so the dashboard checks settings before a run.
    """
    peers = num_hospitals - 1
    if peers < 1 or alpha_k * peers <= sigma * (1.0 + 1e-12):
        return None
    return (
        f"amp.alpha_k={alpha_k} with amp.sigma={sigma} and {num_hospitals} hospitals could make a hospital's "
        f"self-weight xi_ii negative (needs alpha_k * (m-1) <= sigma): set amp.alpha_k <= {sigma / peers:.6g} "
        "or raise amp.sigma"
    )


def max_weight_problem(num_hospitals: int, max_weight: float) -> str | None:
    """Why ``server.max_weight`` cannot cap the weights of ``num_hospitals`` hospitals, or ``None`` when it can.

    The weights sum to 1, so some hospital has at least ``1/m``: a cap below ``1/m`` cannot hold (a relative
    tolerance of 1e-12 lets ``1/m`` itself through); ``num_hospitals = 0`` (not known yet) checks only ``(0, 1]``.
    The one rule: the configuration applies it when ``strategy.clients`` lists the hospitals, the averaging
    strategies when a run starts (``federation.strategies.fedavg.Averaging``), and
    `federation.aggregation.cap_weights` on every call; it needs no torch.
    """
    if not (math.isfinite(max_weight) and 0.0 < max_weight <= 1.0):
        return f"config server.max_weight = {max_weight!r} is out of range: use a share in (0, 1], e.g. 0.5"
    if num_hospitals < 1 or max_weight * num_hospitals >= 1.0 - 1e-12:
        return None
    least = math.ceil(1e6 / num_hospitals) / 1e6  # 1/m rounded up, so that the suggested value is accepted
    return (
        f"config server.max_weight = {max_weight!r} is out of range: with {num_hospitals} "
        f"{'hospital' if num_hospitals == 1 else 'hospitals'} the weights sum to 1, so a cap below 1/{num_hospitals} "
        f"cannot hold: use server.max_weight >= {least:g} (or leave it unset: no cap)"
    )
