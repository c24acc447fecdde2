"""FedLWS: adaptive layer-wise weight shrinking (Shi et al., ICLR 2025; paper 002, Eq. 4, 7-9).

After the inner strategy has aggregated ``w_hat`` from the clients' models ``w_k`` that started from the
global model ``w = w_g^t``, every layer ``l`` of the aggregate is shrunk:

    ``g_kl = w_kl - w_l``, ``tau_l = (1/K) sum_k ||g_kl - mean_k g_kl||``                     (Eq. 4, 8)
    ``gamma_l = ||w_l|| / (beta * tau_l * ||w_hat_l - w_l|| + ||w_l||)``, ``w^{t+1}_l = gamma_l w_hat_l``  (Eq. 8-9)

(``federation.strategies.aggregation.lws_factors``). A layer is the trainable parameters of one module, weight and bias
together (the public implementation closes a layer at each bias; shrinking a zero-initialised bias on its own
would give ``||w_l|| = 0``, for which ``gamma_l = 1``). BatchNorm running statistics are never shrunk (they
are statistics of the activations, not weights; the public code multiplies them too, a quirk not followed
here). With ``nhead > 0`` only the shared part is in the aggregate, so only it is shrunk. Clients report
nothing extra: the instructions are the inner strategy's. ``aggregation.jsonl`` gets ``fedlws``: beta and, per
layer, ``gamma`` and ``tau``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any

from federation.config import RunConfig
from federation.errors import FederationError
from federation.strategies.aggregation import lws_factors, lws_spread
from federation.strategies.context import StrategyContext
from federation.strategies.fedsaf import trainable_keys
from federation.strategies.flat import FlatSpec, flatten, unflatten
from federation.strategies.wrappers.base import GlobalModelWrapper, finite_or_none
from federation.wire.contract import Strategy, TensorDict, TrainReply


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
        clients = sorted(replies)
        if not clients:
            raise FederationError(f"round {server_round}: no hospital replied")
        previous = flatten([before], self.spec)[0]
        stacked = flatten([replies[c].shared for c in clients], self.spec)
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
