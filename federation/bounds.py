"""Rules on the aggregation weights that need the number of hospitals, written once and torch-free: the
configuration checks them when the hospitals are listed (`federation.config`), the dashboard before a run
(`app.dashboard.checks`), and the aggregation maths on every call (`federation.strategies.amp`,
`federation.strategies.aggregation`), which thereby needs nothing of the configuration package.

- `amp_bound_problem`: AMP's self-weight bound, FedSAF paper 001, Eq. 16 (``alpha_k (m - 1) <= sigma``).
- `max_weight_problem`: ``server.max_weight`` against ``1/m``.
- `robust_problem`: what ``server.robust`` needs (a weight cap below 1/2 and 3 hospitals for norm bounding,
  ``2 trim + 1`` hospitals for the trimmed mean); `norm_factor_problem`: ``server.norm_factor`` in [1, 10].

Standard library only.
"""

from __future__ import annotations

import math


def amp_bound_problem(num_hospitals: int, alpha_k: float, sigma: float) -> str | None:
    """Why AMP with ``alpha_k`` and ``sigma`` could give one of ``num_hospitals`` hospitals a negative self-weight
    (Eq. 16), or ``None`` when it cannot.

    For a distance ``d >= 0``, ``A'(d) = exp(-d/sigma)/sigma <= 1/sigma``, so ``xi_ii >= 1 - alpha_k (m - 1) /
    sigma``: non-negative exactly when ``alpha_k (m - 1) <= sigma`` (docs/design.md). The boundary itself is allowed
    (a relative tolerance of 1e-12). The one rule: `federation.strategies.amp.check_amp_settings`, which the engine
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
    `federation.strategies.aggregation.cap_weights` on every call; it needs no torch.
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


# server.norm_factor's range (docs/federation.md, "Robust aggregation"): below 1 every honest update is shrunk each
# round as well (1e-300 freezes the model), above 10 an update 10 times the median passes untouched.
NORM_FACTOR_RANGE = (1.0, 10.0)
# norm bounding needs a median that is an honest hospital's norm: more than half honest, so at least 3 hospitals
NORM_BOUND_LEAST = 3


def norm_factor_problem(factor: float) -> str | None:
    """Why ``server.norm_factor`` is outside ``NORM_FACTOR_RANGE`` (or ``None``).

    Norm bounding (Sun et al., 2019, "Can you really backdoor federated learning?") clips every update to
    ``factor x`` the round's median update norm: with ``factor < 1`` the median hospital's own update is clipped
    too, every round, so the model moves by at most ``factor`` of an honest step (1e-300 freezes it); with a large
    factor an update that many times the median passes whole.
    """
    lo, hi = NORM_FACTOR_RANGE
    if math.isfinite(factor) and lo <= factor <= hi:
        return None
    return (
        f"config server.norm_factor = {factor!r} is out of range: use a factor in [{lo:g}, {hi:g}] of the median "
        "update norm (below 1 every honest update is shrunk too and the model stalls; above 10 a scaled update "
        "passes)"
    )


def robust_problem(
    num_hospitals: int, robust: str | None, trim: int, max_weight: float | None
) -> tuple[str, str] | None:
    """Why ``server.robust`` cannot defend a run of ``num_hospitals`` hospitals, as ``(key, message)`` with the
    setting to change, or ``None`` when it can.

    - ``"norm_bound"`` (Sun et al., 2019) bounds each update's *norm* against the round's median norm, not its
      *weight*: a hospital declaring 10^6 tiles beside two of 250 would weigh 0.9995 and its bounded, sign-flipped
      update would still win. So it needs ``server.max_weight`` below 1/2 (a hospital of weight ``w`` sending
      ``-u`` against the others' ``u``, all of norm at most the bound, leaves ``(1 - 2w) u``: progress only for
      ``w < 1/2``), and at least 3 hospitals (the median is an honest norm only while more than half are honest;
      with 2 the median is the mean of the two norms, so a x50 update sets its own bound).
    - ``"trimmed_mean"`` (Yin et al., 2018, Definition 2) drops ``trim`` values at each end: it needs
      ``m >= 2 trim + 1`` hospitals, else nothing is left (``trim`` is never lowered silently).

    ``num_hospitals = 0`` (not known yet: ``strategy.clients = "all"``) checks only what needs no count; the
    engine checks again when the hospitals have answered (`federation.strategies.fedavg.Averaging`).
    """
    m = num_hospitals
    if robust == "norm_bound":
        if 0 < m < NORM_BOUND_LEAST:
            return "server.robust", (
                f"config server.robust = 'norm_bound' needs at least {NORM_BOUND_LEAST} hospitals, and this run has "
                f"{m}: the bound is the median update norm, an honest one only while more than half the hospitals "
                "are honest; leave server.robust unset or federate 3 or more hospitals"
            )
        if max_weight is None or not max_weight < 0.5:
            return "server.max_weight", (
                f"config server.robust = 'norm_bound' needs server.max_weight below 0.5 (it is {max_weight!r}): norm "
                "bounding limits the size of each update, not its weight, so a hospital declaring 10^6 tiles would "
                "still carry the average; set server.max_weight (e.g. 0.4, at least 1/m for m hospitals)"
            )
    if robust == "trimmed_mean" and m > 0 and 2 * trim >= m:
        if m < 3:
            return "server.robust", (
                f"config server.robust = 'trimmed_mean' needs at least 3 hospitals, and this run has {m}: with "
                "fewer it drops nothing and is a plain mean; leave server.robust unset or federate 3 or more"
            )
        return "server.trim", (
            f"config server.trim = {trim} is out of range: with {m} "
            f"{'hospital' if m == 1 else 'hospitals'} dropping {trim} at each end leaves none: use server.trim <= "
            f"{(m - 1) // 2} (trim {trim} needs at least {2 * trim + 1} hospitals)"
        )
    return None
