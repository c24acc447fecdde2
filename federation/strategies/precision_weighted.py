"""Precision-weighted federated learning (Reyes et al., paper 004; ``../shared/reference/seed-methods.md``).

Each client trains with Adam (a fresh optimiser each round) and reports, with its weights, the bias-corrected
second moments ``v_hat_k = exp_avg_sq / (1 - beta2^step)`` of its shared parameters, averaged over the second half
of its last local epoch (``Recipe.second_moments``; counted as upload traffic). The server averages every value
of the shared *parameters* with its own weights (Eq. 6, ``federation.strategies.aggregation.precision_weighted_sum``):

    ``pi_k = (v_hat_k + eps)^-1 / sum_j (v_hat_j + eps)^-1``,   ``w^{t+1} = sum_k pi_k w_k``

falling back to ``n_k / n`` where every client's ``v_hat`` is 0 (a parameter no step moved). BatchNorm buffers
have no second moment and are averaged with ``n_k / n``, as in FedAvg. ``precision_weighted.inverse = false`` is
the alternative reading of the paper (weight by ``v_hat + eps``). Everything else is FedAvg's: one global model,
sent to every client each round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from federation.config import RunConfig, ServerSection
from federation.errors import FederationError
from federation.strategies.aggregation import cap_weights, precision_weighted_sum, precision_weights, weighted_sum
from federation.strategies.context import (
    StrategyContext,
    cap_example_weights,
    example_weights,
    recipe_from_config,
    resolved_nhead,
)
from federation.strategies.fedavg import Averaging
from federation.strategies.fedsaf import trainable_keys
from federation.strategies.flat import FlatSpec, flatten, unflatten
from federation.wire.contract import Recipe, TrainReply


class PrecisionWeighted(Averaging):
    """FedAvg's global model, aggregated value by value with the clients' precisions (paper 004, Eq. 6)."""

    def __init__(
        self,
        recipe: Recipe,
        nhead: int,
        ctx: StrategyContext,
        param_keys: set[str],
        eps: float,
        inverse: bool,
        server: ServerSection | None = None,
    ) -> None:
        super().__init__("precision_weighted", recipe, nhead, ctx, server=server)
        self.eps = eps
        self.inverse = inverse
        self.param_keys = [k for k in self.keys if k in param_keys]
        self.buffer_keys = [k for k in self.keys if k not in param_keys]
        self.param_spec = FlatSpec.of(self.global_state, self.param_keys)
        self.buffer_spec = FlatSpec.of(self.global_state, self.buffer_keys) if self.buffer_keys else None

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        clients = sorted(replies)
        replies, robust = self.bound_updates(replies)
        weights = example_weights(server_round, replies, clients)
        capping: dict[str, Any] = {}
        if self.max_weight is not None:
            weights, capping["weight_cap"] = cap_example_weights(weights, clients, self.max_weight)
        for c in clients:
            missing = [k for k in self.param_keys if k not in replies[c].second_moments]
            if missing:
                raise FederationError(
                    f"round {server_round}: client {c} sent no second moments for {missing[:3]}: "
                    "precision_weighted needs client.optimizer = adam"
                )
        w = flatten([replies[c].shared for c in clients], self.param_spec)
        v = flatten([replies[c].second_moments for c in clients], self.param_spec)
        if self.max_weight is None:
            values = precision_weighted_sum(w, v, self.eps, fallback=weights, inverse=self.inverse)
        else:
            values = self._capped_sum(w, v, weights, clients, capping["weight_cap"])
        merged = unflatten(values, self.param_spec)
        if self.buffer_spec is not None:
            buffers = flatten([replies[c].shared for c in clients], self.buffer_spec)
            merged.update(unflatten(weighted_sum(buffers, weights), self.buffer_spec))
        self.global_state = {k: merged[k] for k in self.keys}
        log_v = torch.log10(v.double() + self.eps)
        return {
            "weights": {str(c): wt for c, wt in zip(clients, weights, strict=True)},
            "mean_log10_second_moment": {str(c): float(log_v[i].mean()) for i, c in enumerate(clients)},
            "eps": self.eps,
            "inverse": self.inverse,
            **capping,
            **robust,
        }

    def _capped_sum(
        self, w: torch.Tensor, v: torch.Tensor, weights: list[float], clients: list[int], record: dict[str, Any]
    ) -> torch.Tensor:
        """Eq. 6 with every value's weights ``pi_k`` capped at ``server.max_weight``
        (`federation.strategies.aggregation.
        cap_weights`, one column per value; uniform in a round with fewer than ``1/max_weight`` replies, as
        ``weights`` already are); ``record`` (the round's ``weight_cap``) gets the hospitals lowered at any value."""
        assert self.max_weight is not None
        pi = precision_weights(v, self.eps, fallback=weights, inverse=self.inverse)
        uniform = record["uniform"]
        capped = torch.full_like(pi, 1.0 / len(clients)) if uniform else cap_weights(pi, self.max_weight)
        lowered = (capped < pi).any(dim=1).tolist()
        record["capped"] = sorted(
            set(record["capped"]) | {str(c) for c, low in zip(clients, lowered, strict=True) if low}, key=int
        )
        return (capped * w.detach().to(torch.float64)).sum(dim=0).to(w.dtype)


def build(config: RunConfig, ctx: StrategyContext) -> PrecisionWeighted:
    """Precision-weighted FL with the ``[precision_weighted]`` settings; clients must train with Adam."""
    if config.client.optimizer != "adam":
        raise FederationError(
            "precision_weighted weights clients by Adam's second moments: set client.optimizer = adam "
            "(paper 004 uses lr 0.001, the [adam] defaults)"
        )
    recipe = recipe_from_config(config, second_moments=True)
    settings = config.precision_weighted
    return PrecisionWeighted(
        recipe, resolved_nhead(config), ctx, trainable_keys(config), settings.eps, settings.inverse, config.server
    )
