"""FedAS-style Fisher-weighted aggregation (Yang et al., "FedAS: Bridging Inconsistency in Personalized Federated
Learning", CVPR 2024), the "client synchronisation" the depth-wise method of paper 000 builds on.

FedPer-style split: the last ``nhead`` units (default 1, the classifier) are each hospital's head; the rest is shared.
Each round a hospital trains its whole model from the global shared part and reports the trace of its Fisher
information over the shared parameters (``fedsaf.fisher_estimator``: FedAS's ``full_pass`` sums the squared norms of
the batch-mean gradients over all its training batches). The server averages the shared part with weights ``alpha_i /
sum_k alpha_k`` (``federation.strategies.fisher_weights.fisher_weights``): hospitals whose parameters carry more
information count more. BatchNorm buffers are mixed with the same weights, so each layer stays consistent with its
statistics. FedAS's alignment of the received model to local class prototypes is not used (as in ``depthwise_fim``,
paper 000's comparison point).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from federation.config import RunConfig
from federation.strategies.aggregation import weighted_sum
from federation.strategies.context import (
    StrategyContext,
    cap_example_weights,
    fisher_traces,
    recipe_from_config,
    resolved_nhead,
)
from federation.strategies.fedavg import Averaging
from federation.strategies.fisher_weights import fisher_weights
from federation.strategies.flat import flatten, unflatten
from federation.wire.contract import TrainReply


class FisherWeighted(Averaging):
    """One global shared part, averaged with the clients' normalised Fisher traces (capped at
    ``server.max_weight`` when set; norm-bounded first with ``server.robust = "norm_bound"``)."""

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        hospitals = sorted(replies)
        replies, robust = self.bound_updates(replies)
        traces = fisher_traces(server_round, replies, hospitals, " (fedas needs the recipe's fisher_batch)")
        gamma = fisher_weights(traces)
        capping: dict[str, Any] = {}
        if self.max_weight is not None:
            capped, capping["weight_cap"] = cap_example_weights(gamma.tolist(), hospitals, self.max_weight)
            gamma = torch.tensor(capped, dtype=torch.float64)
        stacked = flatten([replies[c].shared for c in hospitals], self.spec)
        self.global_state = unflatten(weighted_sum(stacked, gamma), self.spec)
        return {
            "fisher_traces": traces,
            "weights": {str(c): float(g) for c, g in zip(hospitals, gamma, strict=True)},
            **capping,
            **robust,
        }


def build(config: RunConfig, ctx: StrategyContext) -> FisherWeighted:
    """FedAS aggregation: whole-model local training, Fisher traces by ``fedsaf.fisher_estimator``."""
    recipe = recipe_from_config(config, fisher_batch=config.fedsaf.fisher_batch)
    return FisherWeighted("fedas", recipe, resolved_nhead(config), ctx, server=config.server)
