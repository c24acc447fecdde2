"""FedAvg (McMahan et al., 2017; a baseline of FedSAF paper 001, Tables 6-7), and the averaging core it shares
with FedProx and FedRep.

Each round the server sends the global shared weights w to every client, each client trains from them and
returns its own w_i, and the server sets ``w = sum_i (n_i / n) w_i`` with ``n_i`` the client's training tiles.
The average runs over the whole shared ``state_dict``, BatchNorm running means and variances included, so the
deployed model's normalisation matches its weights; ``num_batches_tracked`` (an integer counter) is averaged
the same way and rounded back to an integer (``federation.flat.unflatten``). With ``nhead > 0`` the last
``nhead`` layer units stay on each client (FedPer-style); FedAvg proper is ``nhead = 0``.

With ``server.max_weight`` set, the weights ``n_i / n`` are capped at it before averaging (not part of FedAvg: a
safeguard against a hospital that declares an inflated count; `federation.aggregation.cap_weights`), for FedAvg,
FedProx, FedRep and FedBN; the weights used are the ones recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from federation.aggregation import weighted_sum
from federation.config import RunConfig, max_weight_problem
from federation.contract import Recipe, TensorDict, TrainInstruction, TrainReply
from federation.errors import FederationError
from federation.flat import FlatSpec, flatten, unflatten
from federation.strategies.context import (
    StrategyContext,
    cap_example_weights,
    example_weights,
    recipe_from_config,
    resolved_nhead,
)


class Averaging:
    """Example-weighted averaging of the shared part; the recipe decides FedAvg, FedProx or FedRep.

    ``recipe.prox_mu > 0`` sends the global weights as the proximal centre too (FedProx). ``recipe.head_epochs``
    > 0 trains each client's head before its base (FedRep). ``max_weight`` (``server.max_weight``) caps each
    client's weight ``n_i / n``; ``None`` caps nothing. The only cross-round state is the global weights.

    What a hospital deploys after round ``r`` (``configure_evaluate``) is the global model, which is also what round
    ``r + 1`` sends it to train from: its evaluation rides with that training (``evaluates_next_start``).
    """

    evaluates_next_start = True

    def __init__(
        self, name: str, recipe: Recipe, nhead: int, ctx: StrategyContext, *, max_weight: float | None = None
    ) -> None:
        self.name = name
        self.recipe = recipe
        self.nhead = nhead
        if max_weight is not None:
            problem = max_weight_problem(ctx.num_clients, max_weight)
            if problem is not None:
                raise FederationError(problem)
        self.max_weight = max_weight
        self.keys = ctx.shared_keys(nhead)
        if not self.keys:
            raise FederationError(f"{name} with nhead={nhead} shares no layer: use a smaller strategy.nhead")
        self.global_state: TensorDict = ctx.initial(self.keys)
        self.spec = FlatSpec.of(self.global_state, self.keys)

    def shared_keys(self, state_keys: Sequence[str], units: Sequence[Sequence[str]]) -> list[str]:
        return list(self.keys)  # the base units less what strategy.bn keeps local (StrategyContext.shared_keys)

    def configure_train(self, server_round: int, clients: Sequence[int]) -> dict[int, TrainInstruction]:
        # One dict for every client (the engine never mutates what it is sent); FedProx's proximal centre is the
        # global weights themselves: sent and counted once
        pulled = self.recipe.prox_mu > 0
        return {
            c: TrainInstruction(client=c, recipe=self.recipe, shared=self.global_state, centre_is_shared=pulled)
            for c in clients
        }

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        clients = sorted(replies)
        weights = example_weights(server_round, replies, clients)
        capping: dict[str, Any] = {}
        if self.max_weight is not None:
            weights, capping["weight_cap"] = cap_example_weights(weights, clients, self.max_weight)
        stacked = flatten([replies[c].shared for c in clients], self.spec)
        self.global_state = unflatten(weighted_sum(stacked, weights), self.spec)
        return {"weights": {str(c): w for c, w in zip(clients, weights, strict=True)}, **capping}

    def configure_evaluate(self, server_round: int, clients: Sequence[int]) -> dict[int, TensorDict | None]:
        return dict.fromkeys(clients, self.global_state)

    def state_tensors(self) -> TensorDict:
        return dict(self.global_state)

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        missing = [k for k in self.keys if k not in tensors]
        if missing:
            raise FederationError(f"{self.name} checkpoint lacks global weights {missing[:3]}: it is from another run")
        self.global_state = {k: tensors[k].detach().clone() for k in self.keys}

    def state_json(self) -> dict[str, Any]:
        return {"nhead": self.nhead}

    def load_state_json(self, state: Mapping[str, Any]) -> None:
        if state.get("nhead", self.nhead) != self.nhead:
            raise FederationError(f"{self.name} checkpoint was made with nhead={state['nhead']}, not {self.nhead}")


def build(config: RunConfig, ctx: StrategyContext) -> Averaging:
    """FedAvg: one phase over all parameters, no proximal term."""
    return Averaging(
        "fedavg", recipe_from_config(config), resolved_nhead(config), ctx, max_weight=config.server.max_weight
    )
