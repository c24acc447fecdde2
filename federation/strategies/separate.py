"""Separate: every hospital trains alone (the "Separate" column of FedSAF paper 001, Table 3).

Nothing is sent in either direction: no tensor is shared, the server only asks each client to train its own
model with the ``[client]`` recipe and then to evaluate it. It is the lower bound federated methods must beat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from federation.config import RunConfig
from federation.strategies.context import StrategyContext, recipe_from_config
from federation.wire.contract import TensorDict, TrainInstruction, TrainReply


class Separate:
    """Local training only; the strategy has no cross-round state."""

    name = "separate"
    evaluates_own = True  # each hospital's own model is what it deploys: evaluated with its training
    evaluates_next_start = False

    def __init__(self, config: RunConfig) -> None:
        self.recipe = recipe_from_config(config)

    def shared_keys(self, state_keys: Sequence[str], units: Sequence[Sequence[str]]) -> list[str]:
        return []

    def configure_train(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TrainInstruction]:
        return {c: TrainInstruction(client=c, recipe=self.recipe) for c in hospitals}

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        return {}

    def configure_evaluate(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TensorDict | None]:
        return dict.fromkeys(hospitals)

    def state_tensors(self) -> TensorDict:
        return {}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        return None

    def state_json(self) -> dict[str, Any]:
        return {}

    def load_state_json(self, state: Mapping[str, Any]) -> None:
        return None


def build(config: RunConfig, ctx: StrategyContext) -> Separate:
    """The Separate baseline (``ctx`` is not needed: nothing is shared)."""
    return Separate(config)
