"""FedLWS: adaptive layer-wise weight shrinking (Shi et al., ICLR 2025; paper 002, Eq. 4, 7-9).

After the inner strategy has aggregated ``w_hat`` from the clients' models ``w_k`` that started from the
global model ``w = w_g^t``, every layer ``l`` of the aggregate is shrunk:

    ``g_kl = w_kl - w_l``, ``tau_l = (1/K) sum_k ||g_kl - mean_k g_kl||``                     (Eq. 4, 8)
    ``gamma_l = ||w_l|| / (beta * tau_l * ||w_hat_l - w_l|| + ||w_l||)``, ``w^{t+1}_l = gamma_l w_hat_l``  (Eq. 8-9)

(``lws_factors``, below). A layer is the trainable parameters of one module, weight and bias together (the public
implementation closes a layer at each bias; shrinking a zero-initialised bias on its own would give ``||w_l|| = 0``,
for which ``gamma_l = 1``). BatchNorm running statistics are never shrunk (they are statistics of the activations, not
weights; the public code multiplies them too, a quirk not followed here). With ``nhead > 0`` only the shared part is
in the aggregate, so only it is shrunk. Clients report nothing extra: the instructions are the inner strategy's.
``aggregation.jsonl`` gets ``fedlws``: beta and, per layer, ``gamma`` and ``tau``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import accumulate, pairwise
from typing import Any

import torch

from federation.config import RunConfig
from federation.errors import FederationError
from federation.strategies.aggregation import _check_matrix, _check_slices
from federation.strategies.context import StrategyContext
from federation.strategies.fedsaf import trainable_keys
from federation.strategies.flat import FlatSpec, flatten, unflatten
from federation.strategies.wrappers.base import GlobalModelWrapper, finite_or_none
from federation.wire.contract import Strategy, TensorDict, TrainReply

# --- The maths: paper 002, Eq. 4, 7-8 ---------------------------------------------------------------------------------


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
    hospitals: torch.Tensor,
    aggregate: torch.Tensor,
    layers: Sequence[slice],
    beta: float,
    *,
    spread: torch.Tensor | None = None,
) -> torch.Tensor:
    """FedLWS layer-wise shrinking factors ``gamma_l`` (Shi et al., ICLR 2025; paper 002, Eq. 4, 7-8), float64 ``[L]``.

    ``previous`` is the global model ``w = w_g^t`` the clients started from (flat ``[d]``), ``hospitals`` their
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
    _check_matrix(hospitals)
    d = hospitals.shape[1]
    if previous.shape != (d,) or aggregate.shape != (d,):
        raise ValueError(
            f"previous {tuple(previous.shape)} and aggregate {tuple(aggregate.shape)} must both be flat [{d}] vectors "
            "like the clients' rows"
        )
    bounds = _check_slices(layers, d, "layer")
    tau = lws_spread(previous, hospitals, layers) if spread is None else spread.to(torch.float64)
    if tau.shape != (len(bounds),):
        raise ValueError(f"spread has shape {tuple(tau.shape)} for {len(bounds)} layers")
    w = previous.detach().to(torch.float64)
    norm_w = _segment_sums(w.square(), bounds).sqrt()
    norm_step = _segment_sums((aggregate.detach().to(torch.float64) - w).square(), bounds).sqrt()
    shrunk = norm_w / (beta * tau * norm_step + norm_w)
    return torch.where(norm_w > 0, shrunk, torch.ones_like(norm_w))


def lws_spread(previous: torch.Tensor, hospitals: torch.Tensor, layers: Sequence[slice]) -> torch.Tensor:
    """``tau_l`` of paper 002, Eq. 8 (the mean distance of the clients' pseudo-gradients from their mean), ``[L]``.

    The same quantity ``lws_factors`` uses, exposed for logging.
    """
    _check_matrix(hospitals)
    if previous.shape != (hospitals.shape[1],):
        raise ValueError(f"previous {tuple(previous.shape)} must be a flat [{hospitals.shape[1]}] vector")
    bounds = _check_slices(layers, hospitals.shape[1], "layer")
    g = hospitals.detach().to(torch.float64) - previous.detach().to(torch.float64)
    # The mean over clients is taken value by value, so it can be taken once for the whole vector.
    deviation = g - g.mean(dim=0, keepdim=True)
    return _segment_sums(deviation.square(), bounds).sqrt().mean(dim=0)


# --- The wrapper ------------------------------------------------------------------------------------------------------


def module_layers(keys: Sequence[str]) -> tuple[list[str], list[str], list[slice]]:
    """Group parameter ``keys`` by module (``key.rsplit('.', 1)[0]``), in order of first appearance.

    Returns the keys reordered so that each module's tensors are adjacent, the module names, and each module's
    range of positions in the reordered keys.
    """
    modules: dict[str, list[str]] = {}
    for key in keys:
        modules.setdefault(key.rsplit(".", 1)[0], []).append(key)
    ordered = [k for members in modules.values() for k in members]
    bounds, start = [], 0
    for members in modules.values():
        bounds.append(slice(start, start + len(members)))
        start += len(members)
    return ordered, list(modules), bounds


class LayerWiseShrinking(GlobalModelWrapper):
    """FedLWS around an averaging strategy; no cross-round state of its own (beta is a setting)."""

    label = "fedlws"

    def __init__(self, inner: Strategy, ctx: StrategyContext, param_keys: set[str], beta: float) -> None:
        super().__init__(inner, ctx, param_keys)
        if not beta > 0:
            raise FederationError(f"fedlws.beta must be > 0, got {beta}")
        self.beta = beta
        ordered, self.layer_names, key_ranges = module_layers(self.param_keys)
        self.spec = FlatSpec.of(inner.state_tensors(), ordered)
        offsets = list(accumulate(self.spec.numels, initial=0))
        self.layers = [slice(offsets[r.start], offsets[r.stop]) for r in key_ranges]

    def settings(self) -> dict[str, Any]:
        return {"beta": self.beta}

    def adjust(
        self, server_round: int, before: TensorDict, after: TensorDict, replies: Mapping[int, TrainReply]
    ) -> tuple[TensorDict, dict[str, Any]]:
        hospitals = sorted(replies)
        if not hospitals:
            raise FederationError(f"round {server_round}: no hospital replied")
        previous = flatten([before], self.spec)[0]
        stacked = flatten([replies[c].shared for c in hospitals], self.spec)
        aggregate = flatten([after], self.spec)[0]
        tau = lws_spread(previous, stacked, self.layers)
        gamma = lws_factors(previous, stacked, aggregate, self.layers, self.beta, spread=tau)
        scaled = aggregate.clone()
        for layer, g in zip(self.layers, gamma.tolist(), strict=True):
            scaled[layer] = aggregate[layer] * g
        adjusted = {**after, **unflatten(scaled, self.spec)}
        log = {
            "beta": self.beta,
            "layers": self.layer_names,
            "gamma": finite_or_none(gamma.tolist()),
            "tau": finite_or_none(tau.tolist()),
            "gamma_min": float(gamma.min()),
            "gamma_mean": float(gamma.mean()),
        }
        return adjusted, log


def wrap(inner: Strategy, config: RunConfig, ctx: StrategyContext) -> LayerWiseShrinking:
    """FedLWS with ``[fedlws] beta`` around ``inner`` (refused unless ``inner`` keeps one global model)."""
    return LayerWiseShrinking(inner, ctx, trainable_keys(config), config.fedlws.beta)
