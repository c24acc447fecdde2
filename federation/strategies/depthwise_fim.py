"""Depth-wise FIM aggregation (Nutaba & Watanabe, "Depth-Wise Federated Learning Based on Model Parameter
Reliability"; paper 000, Eq. 1-3), and its "Reverse" ablation (``depthwise_fim.reverse``).

FedPer/FedAS-style split: the last ``nhead`` layer units (default 1, the classifier) are each client's own head;
the rest, ``theta``, is shared. Each round a client trains its whole model (one phase, ``client.epochs``) from
the global ``theta`` and reports ``alpha_i``, the trace of its Fisher information over ``theta``
(``metrics["fisher_trace"]``, the client's estimator on ``fedsaf.fisher_batch`` examples). The server then
aggregates each shared layer ``j`` (input side first, ``N`` shared layer units, ``M`` replying clients) from only
the ``M_j = ceil(j / N * M)`` clients with the largest traces (Eq. 1), weighted by ``alpha_i`` normalised over
them (Eq. 2), so the deepest shared layer uses everyone and the first only the most reliable client(s)
(``depthwise_fisher_weights``, below). Eq. 3's ``theta_j + sum abar_ij (theta_ij - theta_j)``
equals ``sum abar_ij theta_ij`` since the weights sum to 1. ``reverse`` uses ``M_j = ceil((N - j + 1) / N * M)``.

A "layer" is a model layer unit (``models.split_units``): with 5 hospitals and 14 shared MobileNetV3-Small
units, ``M_1 = 1``. A unit's BatchNorm running statistics are mixed with the unit's weights, so a layer stays
consistent with its statistics. FedAS's alignment of the global model to local class prototypes is not used.
``aggregation.jsonl`` gets the traces, ``M_j`` per unit and the weight matrix ``layer_weights`` (units x clients).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate, pairwise
from typing import Any

import torch

from federation.bounds import max_weight_problem
from federation.config import RunConfig, ServerSection
from federation.errors import FederationError
from federation.strategies.aggregation import cap_weights, weighted_sum
from federation.strategies.context import StrategyContext, fisher_traces, recipe_from_config, resolved_nhead
from federation.strategies.fedavg import Averaging
from federation.strategies.fisher_weights import _check_traces
from federation.strategies.flat import flatten, unflatten
from federation.wire.contract import Recipe, TrainReply

# --- The maths: paper 000, Eq. 1-3 ------------------------------------------------------------------------------------


def depthwise_top_counts(num_layers: int, num_hospitals: int, reverse: bool = False) -> list[int]:
    """``M_j`` for ``j = 1 .. N`` (input side first): paper 000, Eq. 1, ``M_j = ceil(j / N * M)``.

    ``reverse`` is the paper's "Reverse" ablation, ``M_j = ceil((N - j + 1) / N * M)``: the input side then uses
    every client and the output side the fewest. Computed in integers (``ceil(a / b) = (a + b - 1) // b``) so
    that no float rounding moves a boundary.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if num_hospitals < 1:
        raise ValueError(f"num_hospitals must be >= 1, got {num_hospitals}")
    depths = range(num_layers, 0, -1) if reverse else range(1, num_layers + 1)
    return [(j * num_hospitals + num_layers - 1) // num_layers for j in depths]


def depthwise_fisher_weights(
    traces: Sequence[float] | torch.Tensor, num_layers: int, reverse: bool = False
) -> torch.Tensor:
    """Depth-wise Fisher aggregation weights (Nutaba & Watanabe, paper 000, Eq. 1-3), float64 ``(N, m)``.

    Row ``j`` (input side first, ``j = 1 .. N = num_layers``) holds each client's weight in layer ``j``:
    ``M_j = ceil(j / N * M)`` (Eq. 1; ``reverse``: ``ceil((N - j + 1) / N * M)``), ``S_j`` = the ``M_j`` clients
    with the largest Fisher traces ``alpha_i`` (ties go to the lower client index), and
    ``abar_ij = alpha_i / sum_{k in S_j} alpha_k`` for ``i in S_j``, 0 otherwise (Eq. 2, whose ``S_i`` in the
    denominator is read as the typo for ``S_j``). Eq. 3, ``theta_j^t + sum_i abar_ij (theta_ij^t - theta_j^t)``,
    then equals ``sum_i abar_ij theta_ij^t`` because each row sums to 1, so ``W[j] @ stacked_layer_j`` is the
    new layer. The deepest layer uses every client; the shallowest only the top one(s).

    Raises ``FederationError`` for a negative or non-finite trace, and when a layer's selected clients all
    have trace 0 (Eq. 2 is then undefined: no selected client carries any gradient signal).
    """
    t = _check_traces(traces, "depthwise_fisher_weights")
    m = t.numel()
    counts = depthwise_top_counts(num_layers, m, reverse)
    # Descending trace, ties by ascending client index: a stable sort of the negated traces.
    order = torch.sort(-t, stable=True).indices
    weights = torch.zeros(num_layers, m, dtype=torch.float64)
    for j, count in enumerate(counts):
        chosen = order[:count]
        total = t[chosen].sum()
        if total <= 0:
            raise FederationError(
                f"depth-wise Fisher weights: the top {count} client(s) of layer {j + 1} all report a Fisher trace "
                "of 0, so Eq. 2 is undefined (no selected client has any gradient signal; check fisher_batch)"
            )
        weights[j, chosen] = t[chosen] / total
    return weights


# --- The strategy -----------------------------------------------------------------------------------------------------


class DepthwiseFisher(Averaging):
    """Averaging whose weights differ per shared layer unit (paper 000); the global ``theta`` is its only state."""

    def __init__(
        self, recipe: Recipe, nhead: int, ctx: StrategyContext, *, reverse: bool, server: ServerSection | None = None
    ) -> None:
        super().__init__("depthwise_fim", recipe, nhead, ctx, server=server)
        if recipe.fisher_batch < 1:
            raise FederationError("depthwise_fim weights layers by the hospitals' Fisher traces: set fisher_batch >= 1")
        self.reverse = reverse
        # A layer is a unit's shared keys (all of them, unless a setting keeps some, e.g. BatchNorm, local).
        shared = set(self.keys)
        units = [(name, [k for k in keys if k in shared]) for name, keys in ctx.units]
        units = [(name, keys) for name, keys in units if keys]
        self.unit_names = [name for name, _ in units]
        if [k for _, keys in units for k in keys] != list(self.spec.keys):
            raise FederationError("depthwise_fim: the shared keys are not in the order of the model's layer units")
        numel = dict(zip(self.spec.keys, self.spec.numels, strict=True))
        bounds = list(accumulate((sum(numel[k] for k in keys) for _, keys in units), initial=0))
        self.unit_slices = [slice(a, b) for a, b in pairwise(bounds)]

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        hospitals = sorted(replies)
        if not hospitals:
            raise FederationError(f"round {server_round}: no hospital replied")
        replies, robust = self.bound_updates(replies)
        traces = fisher_traces(
            server_round,
            replies,
            hospitals,
            ", which depthwise_fim needs (the client recipe must have fisher_batch > 0)",
        )
        weights = depthwise_fisher_weights(traces, len(self.unit_slices), reverse=self.reverse)
        capping: dict[str, Any] = {}
        if self.max_weight is not None:
            weights, capping["weight_cap"] = self._capped(weights, hospitals)
        stacked = flatten([replies[c].shared for c in hospitals], self.spec)
        merged = torch.empty(self.spec.numel, dtype=stacked.dtype)
        for row, layer in zip(weights, self.unit_slices, strict=True):
            merged[layer] = weighted_sum(stacked[:, layer], row)
        self.global_state = unflatten(merged, self.spec)
        return {
            "clients": hospitals,
            "fisher_traces": traces,
            "reverse": self.reverse,
            "units": self.unit_names,
            "top": depthwise_top_counts(len(self.unit_slices), len(hospitals), self.reverse),
            "layer_weights": weights.tolist(),
            **capping,
            **robust,
        }

    def _capped(self, weights: torch.Tensor, hospitals: list[int]) -> tuple[torch.Tensor, dict[str, Any]]:
        """Each layer's weights (a row of ``weights``) capped at ``server.max_weight``
        (`federation.strategies.aggregation.
        cap_weights`, one column per layer): what a selected client loses goes to the other selected ones in
        proportion, or, where the layer selected too few of them to hold the cap (``M_j < 1/max_weight``: the
        shallowest layers), evenly to those not selected. A round with fewer than ``1/max_weight`` replies averages
        every layer uniformly (``uniform``), as the example-weighted strategies do."""
        assert self.max_weight is not None
        m = len(hospitals)
        uniform = max_weight_problem(m, self.max_weight) is not None
        capped = torch.full_like(weights, 1.0 / m) if uniform else cap_weights(weights.T, self.max_weight).T
        lowered = (capped < weights).any(dim=0).tolist()
        record = {
            "max_weight": self.max_weight,
            "capped": [str(c) for c, low in zip(hospitals, lowered, strict=True) if low],
            "uniform": uniform,
        }
        return capped.contiguous(), record

    def state_json(self) -> dict[str, Any]:
        return {**super().state_json(), "reverse": self.reverse}

    def load_state_json(self, state: Mapping[str, Any]) -> None:
        super().load_state_json(state)
        if state.get("reverse", self.reverse) != self.reverse:
            saved = state["reverse"]
            raise FederationError(f"depthwise_fim checkpoint was made with reverse={saved}, not {self.reverse}")


def build(config: RunConfig, ctx: StrategyContext) -> DepthwiseFisher:
    """Depth-wise FIM with ``[depthwise_fim] reverse``; clients train the whole model in one phase and report
    their Fisher trace on ``fedsaf.fisher_batch`` examples."""
    recipe = recipe_from_config(config, fisher_batch=config.fedsaf.fisher_batch)
    return DepthwiseFisher(
        recipe, resolved_nhead(config), ctx, reverse=config.depthwise_fim.reverse, server=config.server
    )
