"""Precision-weighted federated learning (Reyes et al., paper 004; ``../shared/reference/seed-methods.md``).

Each client trains with Adam (a fresh optimiser each round) and reports, with its weights, the bias-corrected
second moments ``v_hat_k = exp_avg_sq / (1 - beta2^step)`` of its shared parameters, averaged over the second half
of its last local epoch (``Recipe.second_moments``; counted as upload traffic). The server averages every value
of the shared *parameters* with its own weights (Eq. 6, ``precision_weighted_sum``, below):

    ``pi_k = (v_hat_k + eps)^-1 / sum_j (v_hat_j + eps)^-1``,   ``w^{t+1} = sum_k pi_k w_k``

falling back to ``n_k / n`` where every client's ``v_hat`` is 0 (a parameter no step moved). BatchNorm buffers
have no second moment and are averaged with ``n_k / n``, as in FedAvg. ``precision_weighted.inverse = false`` is
the alternative reading of the paper (weight by ``v_hat + eps``). Everything else is FedAvg's: one global model,
sent to every client each round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from federation.config import RunConfig, ServerSection
from federation.errors import FederationError
from federation.strategies.aggregation import _check_matrix, cap_weights, weighted_sum
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

# --- The maths: paper 004, Eq. 6 --------------------------------------------------------------------------------------


def precision_weighted_sum(
    vectors: torch.Tensor,
    second_moments: torch.Tensor,
    eps: float,
    *,
    fallback: Sequence[float] | torch.Tensor | None = None,
    inverse: bool = True,
) -> torch.Tensor:
    """Precision-weighted aggregation (Reyes et al., paper 004, Eq. 6), element-wise, shape ``[d]``.

    ``vectors`` are the clients' weights ``w_k`` (``[K, d]``) and ``second_moments`` their bias-corrected Adam
    second moments ``v_hat_k`` (same shape, >= 0). For every value:

        ``pi_k = (v_hat_k + eps)^-1 / sum_j (v_hat_j + eps)^-1``,   ``w = sum_k pi_k w_k``        (Eq. 6)

    ``eps > 0`` keeps a zero second moment finite (Eq. 6 itself has none). Where *every* client's ``v_hat`` is
    exactly 0 (a frozen or unused parameter: there is no variance estimate at all), Eq. 6 would give uniform
    weights; ``fallback`` (e.g. ``n_k / n``) is used there instead when given.
    ``inverse=False`` is the alternative reading (weight by ``v_hat_k + eps``, Adam's ``v`` as the Fisher
    diagonal, i.e. the precision itself; the paper's Sec. 3 suggests it, Eq. 6 and Sec. 5.4 say inverse).
    Computed in float64, returned in the dtype of ``vectors``.
    """
    _check_matrix(vectors)
    if second_moments.shape != vectors.shape:
        raise ValueError(
            f"second moments of shape {tuple(second_moments.shape)} do not match the vectors {tuple(vectors.shape)}"
        )
    pi = precision_weights(second_moments, eps, fallback=fallback, inverse=inverse)
    return (pi * vectors.detach().to(torch.float64)).sum(dim=0).to(vectors.dtype)


def precision_weights(
    second_moments: torch.Tensor,
    eps: float,
    *,
    fallback: Sequence[float] | torch.Tensor | None = None,
    inverse: bool = True,
) -> torch.Tensor:
    """The weights ``pi_k`` of paper 004, Eq. 6, for every value: float64 ``(K, d)``, each column summing to 1
    (``precision_weighted_sum``, which documents them; ``fallback`` fills the columns where every ``v_hat`` is 0).
    ``server.max_weight`` caps each column (``cap_weights``) before they are applied."""
    _check_matrix(second_moments)
    if not (math.isfinite(eps) and eps > 0):
        raise FederationError(f"precision weighting needs eps > 0 (finite), got {eps}")
    v = second_moments.detach().to(torch.float64)
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()):
        raise FederationError("second moments must be finite and >= 0 (Adam's exp_avg_sq, bias-corrected)")
    raw = 1.0 / (v + eps) if inverse else v + eps
    pi = raw / raw.sum(dim=0, keepdim=True)
    if fallback is not None:
        f = torch.as_tensor(fallback, dtype=torch.float64).flatten()
        if f.numel() != v.shape[0]:
            raise ValueError(f"{f.numel()} fallback weights for {v.shape[0]} vectors")
        unused = (v == 0).all(dim=0)
        pi[:, unused] = f.unsqueeze(1)
    return pi


# --- The strategy -----------------------------------------------------------------------------------------------------


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
        hospitals = sorted(replies)
        replies, robust = self.bound_updates(replies)
        weights = example_weights(server_round, replies, hospitals)
        capping: dict[str, Any] = {}
        if self.max_weight is not None:
            weights, capping["weight_cap"] = cap_example_weights(weights, hospitals, self.max_weight)
        for c in hospitals:
            missing = [k for k in self.param_keys if k not in replies[c].second_moments]
            if missing:
                raise FederationError(
                    f"round {server_round}: client {c} sent no second moments for {missing[:3]}: "
                    "precision_weighted needs client.optimizer = adam"
                )
        w = flatten([replies[c].shared for c in hospitals], self.param_spec)
        v = flatten([replies[c].second_moments for c in hospitals], self.param_spec)
        if self.max_weight is None:
            values = precision_weighted_sum(w, v, self.eps, fallback=weights, inverse=self.inverse)
        else:
            values = self._capped_sum(w, v, weights, hospitals, capping["weight_cap"])
        merged = unflatten(values, self.param_spec)
        if self.buffer_spec is not None:
            buffers = flatten([replies[c].shared for c in hospitals], self.buffer_spec)
            merged.update(unflatten(weighted_sum(buffers, weights), self.buffer_spec))
        self.global_state = {k: merged[k] for k in self.keys}
        log_v = torch.log10(v.double() + self.eps)
        return {
            "weights": {str(c): wt for c, wt in zip(hospitals, weights, strict=True)},
            "mean_log10_second_moment": {str(c): float(log_v[i].mean()) for i, c in enumerate(hospitals)},
            "eps": self.eps,
            "inverse": self.inverse,
            **capping,
            **robust,
        }

    def _capped_sum(
        self, w: torch.Tensor, v: torch.Tensor, weights: list[float], hospitals: list[int], record: dict[str, Any]
    ) -> torch.Tensor:
        """Eq. 6 with every value's weights ``pi_k`` capped at ``server.max_weight``
        (`federation.strategies.aggregation.
        cap_weights`, one column per value; uniform in a round with fewer than ``1/max_weight`` replies, as
        ``weights`` already are); ``record`` (the round's ``weight_cap``) gets the hospitals lowered at any value."""
        assert self.max_weight is not None
        pi = precision_weights(v, self.eps, fallback=weights, inverse=self.inverse)
        uniform = record["uniform"]
        capped = torch.full_like(pi, 1.0 / len(hospitals)) if uniform else cap_weights(pi, self.max_weight)
        lowered = (capped < pi).any(dim=1).tolist()
        record["capped"] = sorted(
            set(record["capped"]) | {str(c) for c, low in zip(hospitals, lowered, strict=True) if low}, key=int
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
