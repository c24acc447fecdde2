"""FedAvg (McMahan et al., 2017; a baseline of FedSAF paper 001, Tables 6-7), and the averaging core it shares
with FedProx and FedRep.

Each round the server sends the global shared weights w to every client, each client trains from them and
returns its own w_i, and the server sets ``w = sum_i (n_i / n) w_i`` with ``n_i`` the client's training tiles.
The average runs over the whole shared ``state_dict``, BatchNorm running means and variances included, so the
deployed model's normalisation matches its weights; ``num_batches_tracked`` (an integer counter) is averaged
the same way and rounded back to an integer (``federation.strategies.flat.unflatten``). With ``nhead > 0`` the last
``nhead`` layer units stay on each client (FedPer-style); FedAvg proper is ``nhead = 0``.

With ``server.max_weight`` set, the weights ``n_i / n`` are capped at it before averaging (not part of FedAvg: a
safeguard against a hospital that declares an inflated count; `federation.strategies.aggregation.cap_weights`), for
FedAvg,
FedProx, FedRep and FedBN; the weights used are the ones recorded. ``server.robust`` (off by default) bounds each
update's norm before any averaging method weighs it (``"norm_bound"``: Sun et al., 2019), or replaces the weighted
average of FedAvg, FedProx, FedRep and FedBN by the coordinate-wise trimmed mean (``"trimmed_mean"``: Yin et al.,
2018); docs/federation.md, "Robust aggregation".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from federation.bounds import max_weight_problem, robust_problem
from federation.config import RunConfig, ServerSection
from federation.errors import FederationError
from federation.strategies.aggregation import weighted_sum
from federation.strategies.context import (
    StrategyContext,
    cap_example_weights,
    example_weights,
    recipe_from_config,
    resolved_nhead,
)
from federation.strategies.flat import FlatSpec, flatten, unflatten
from federation.strategies.robust import bound_update_norms, trimmed_mean
from federation.wire.contract import Recipe, TensorDict, TrainInstruction, TrainReply


class Averaging:
    """Example-weighted averaging of the shared part; the recipe decides FedAvg, FedProx or FedRep.

    ``recipe.prox_mu > 0`` sends the global weights as the proximal centre too (FedProx). ``recipe.head_epochs``
    > 0 trains each client's head before its base (FedRep). ``server`` (``[server]``): ``max_weight`` caps each
    client's weight ``n_i / n`` (``None`` caps nothing); ``robust`` bounds the updates' norms (``bound_updates``,
    which every averaging subclass calls first) or averages with the trimmed mean. The only cross-round state is the
    global weights.

    What a hospital deploys after round ``r`` (``configure_evaluate``) is the global model, which is also what round
    ``r + 1`` sends it to train from: its evaluation rides with that training (``evaluates_next_start``).
    """

    evaluates_own = False
    evaluates_next_start = True

    def __init__(
        self, name: str, recipe: Recipe, nhead: int, ctx: StrategyContext, *, server: ServerSection | None = None
    ) -> None:
        self.name = name
        self.recipe = recipe
        self.nhead = nhead
        self.server = server if server is not None else ServerSection()
        # the defence's needs, now that the hospitals are known (strategy.clients = "all" is checked only here)
        robust = robust_problem(ctx.num_hospitals, self.server.robust, self.server.trim_count, self.server.max_weight)
        if robust is not None:
            raise FederationError(robust[1], key=robust[0])
        self.max_weight = self.server.max_weight
        if self.max_weight is not None:
            problem = max_weight_problem(ctx.num_hospitals, self.max_weight)
            if problem is not None:
                raise FederationError(problem)
        self.keys = ctx.shared_keys(nhead)
        if not self.keys:
            raise FederationError(f"{name} with nhead={nhead} shares no layer: use a smaller strategy.nhead")
        self.global_state: TensorDict = ctx.initial(self.keys)
        self.spec = FlatSpec.of(self.global_state, self.keys)
        # what norm bounding measures and clips: the floating-point tensors (not integer counters)
        floating = [k for k in self.keys if self.global_state[k].is_floating_point()]
        self.float_spec = FlatSpec.of(self.global_state, floating) if floating else None
        # the replies of the last aggregation as aggregated (norm-bounded under server.robust = "norm_bound"):
        # what a wrapper (FedLWS, FedTLU) must see instead of the raw ones
        self.aggregated_replies: Mapping[int, TrainReply] | None = None

    def shared_keys(self, state_keys: Sequence[str], units: Sequence[Sequence[str]]) -> list[str]:
        return list(self.keys)  # the base units less what strategy.bn keeps local (StrategyContext.shared_keys)

    def configure_train(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TrainInstruction]:
        # One dict for every client (the engine never mutates what it is sent); FedProx's proximal centre is the
        # global weights themselves: sent and counted once
        pulled = self.recipe.prox_mu > 0
        return {
            c: TrainInstruction(client=c, recipe=self.recipe, shared=self.global_state, centre_is_shared=pulled)
            for c in hospitals
        }

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        hospitals = sorted(replies)
        replies, robust = self.bound_updates(replies)
        if self.server.robust == "trimmed_mean":
            # Yin et al. (2018): every value the coordinate-wise mean of what is left after dropping the `trim`
            # largest and smallest; n_i / n is not used. The run starts only with enough hospitals for the trim
            # set (federation.bounds.robust_problem); a round where some were left out trims fewer, never all,
            # and its record says so ("trim_set")
            trim = min(self.server.trim_count, (len(hospitals) - 1) // 2)
            stacked = flatten([replies[c].shared for c in hospitals], self.spec)
            self.global_state = unflatten(trimmed_mean(stacked, trim), self.spec)
            used: dict[str, Any] = {"method": "trimmed_mean", "trim": trim}
            if trim != self.server.trim_count:
                used["trim_set"] = self.server.trim_count
            return {"clients": hospitals, "robust": used}
        weights = example_weights(server_round, replies, hospitals)
        capping: dict[str, Any] = {}
        if self.max_weight is not None:
            weights, capping["weight_cap"] = cap_example_weights(weights, hospitals, self.max_weight)
        stacked = flatten([replies[c].shared for c in hospitals], self.spec)
        self.global_state = unflatten(weighted_sum(stacked, weights), self.spec)
        return {"weights": {str(c): w for c, w in zip(hospitals, weights, strict=True)}, **capping, **robust}

    def bound_updates(self, replies: Mapping[int, TrainReply]) -> tuple[Mapping[int, TrainReply], dict[str, Any]]:
        """``replies`` with every update's norm bounded (``server.robust = "norm_bound"``; Sun et al., 2019;
        `federation.strategies.robust.bound_update_norms`), and what ``aggregation.jsonl`` records of it as
        ``robust``.

        The update of client ``i`` is its floating-point shared tensors minus the global model it was sent this
        round (``self.global_state``, before this aggregation); integer counters (``num_batches_tracked``) are
        neither measured nor changed. Without the setting the replies come back as they are, and nothing is
        recorded. What comes back is kept as ``aggregated_replies`` for a wrapper's post-processing."""
        self.aggregated_replies = replies
        if self.server.robust != "norm_bound" or self.float_spec is None or not replies:
            return replies, {}
        hospitals = sorted(replies)
        spec = self.float_spec
        reference = flatten([self.global_state], spec)[0]
        bounded = bound_update_norms(
            flatten([replies[c].shared for c in hospitals], spec), reference, self.server.bound_factor
        )
        out: dict[int, TrainReply] = dict(replies)
        for row, c in enumerate(hospitals):
            if bool(bounded.clipped[row]):
                clipped = unflatten(bounded.vectors[row], spec)
                out[c] = replace(replies[c], shared={k: clipped.get(k, v) for k, v in replies[c].shared.items()})
        record = {
            "method": "norm_bound",
            "factor": self.server.bound_factor,
            "median_norm": bounded.median,
            "bound": bounded.bound,
            "norms": {str(c): float(n) for c, n in zip(hospitals, bounded.norms.tolist(), strict=True)},
            "clipped": [str(c) for c, hit in zip(hospitals, bounded.clipped.tolist(), strict=True) if hit],
        }
        self.aggregated_replies = out
        return out, {"robust": record}

    def configure_evaluate(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TensorDict | None]:
        return dict.fromkeys(hospitals, self.global_state)

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
    return Averaging("fedavg", recipe_from_config(config), resolved_nhead(config), ctx, server=config.server)
