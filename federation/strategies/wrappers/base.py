"""The delegation shared by the post-aggregation wrappers (FedLWS, paper 002; FedTLU, paper 003).

A wrapper forwards every ``Strategy`` call to the strategy it wraps. In ``aggregate_train`` it keeps the global
model the clients started from (``w^t``), lets the inner strategy aggregate (``w_hat``), hands both and the
replies (as the inner strategy aggregated them: norm-bounded under ``server.robust = "norm_bound"``) to
``adjust``, and loads the adjusted model back into the inner strategy with ``load_state_tensors``,
so that the next ``configure_train``/``configure_evaluate`` and the checkpoint carry it. What ``adjust``
reports is added to the inner record under the wrapper's name (``aggregation.jsonl``).

This needs an inner strategy whose state *is* its global model, keyed by ``state_dict`` names (FedAvg, FedProx,
FedRep, FedBN, FedAS, depth-wise FIM, precision-weighted: ``federation.strategies.AVERAGING``); anything else is
refused when wrapping, naming those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from federation.errors import FederationError
from federation.methods import averaging_names
from federation.runs import finite_or_none as finite_value
from federation.strategies.context import StrategyContext
from federation.strategies.fedavg import Averaging
from federation.wire.contract import Strategy, TensorDict, TrainInstruction, TrainReply


def finite_or_none(values: Sequence[float]) -> list[float | None]:
    """Floats for ``aggregation.jsonl`` (JSON has no inf/nan: those become null; `federation.runs.finite_or_none`)."""
    return [finite_value(v) for v in values]


class GlobalModelWrapper:
    """Delegates the ``Strategy`` protocol to ``inner`` and post-processes its new global model (``adjust``)."""

    label = "wrapper"

    def __init__(self, inner: Strategy, ctx: StrategyContext, param_keys: set[str]) -> None:
        self.inner = inner
        self.name = f"{inner.name}+{self.label}"
        state = inner.state_tensors()
        self.keys = list(state)
        known = set(ctx.state_keys)
        if not self.keys or any(k not in known for k in self.keys):
            raise FederationError(
                f"{self.label} post-processes one global model keyed by the model's state_dict, and strategy "
                f"{inner.name} keeps no such model: wrap one of {averaging_names()}"
            )
        self.param_keys = [k for k in self.keys if k in param_keys]
        if not self.param_keys:
            raise FederationError(f"{self.label}: strategy {inner.name} shares no trainable parameter to post-process")

    # --- the Strategy protocol, delegated ---------------------------------------------------------------------

    @property
    def evaluates_own(self) -> bool:
        return self.inner.evaluates_own

    @property
    def evaluates_next_start(self) -> bool:
        return self.inner.evaluates_next_start

    def shared_keys(self, state_keys: Sequence[str], units: Sequence[Sequence[str]]) -> list[str]:
        return self.inner.shared_keys(state_keys, units)

    def configure_train(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TrainInstruction]:
        return self.inner.configure_train(server_round, hospitals)

    def aggregate_train(self, server_round: int, replies: Mapping[int, TrainReply]) -> dict[str, Any]:
        # A copy: the inner strategy may update its tensors in place.
        before = {k: v.detach().clone() for k, v in self.inner.state_tensors().items()}
        averaging = self.inner if isinstance(self.inner, Averaging) else None
        if averaging is not None:
            averaging.aggregated_replies = None
        record = self.inner.aggregate_train(server_round, replies)
        after = self.inner.state_tensors()
        # the replies as the inner strategy aggregated them: norm-bounded under server.robust = "norm_bound", so
        # that FedLWS's spread tau and FedTLU's scores never see an update the defence clipped
        seen = averaging.aggregated_replies if averaging is not None else None
        adjusted, log = self.adjust(server_round, before, after, replies if seen is None else seen)
        self.inner.load_state_tensors(adjusted)
        return {**record, self.label: log}

    def configure_evaluate(self, server_round: int, hospitals: Sequence[int]) -> dict[int, TensorDict | None]:
        return self.inner.configure_evaluate(server_round, hospitals)

    def state_tensors(self) -> TensorDict:
        return self.inner.state_tensors()

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.inner.load_state_tensors(tensors)

    def state_json(self) -> dict[str, Any]:
        return {**self.inner.state_json(), self.label: self.settings()}

    def load_state_json(self, state: Mapping[str, Any]) -> None:
        mine = self.settings()
        saved = state.get(self.label, mine)
        if saved != mine:
            raise FederationError(f"{self.name} checkpoint was made with {self.label} {saved}, not {mine}")
        self.inner.load_state_json({k: v for k, v in state.items() if k != self.label})

    def __getattr__(self, attr: str) -> Any:
        # Anything else the engine asks of a strategy (the protocol may grow) is the inner strategy's business.
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    # --- what a wrapper adds ------------------------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """The wrapper's own settings (stored with checkpoints; a resumed run must use the same)."""
        return {}

    def adjust(
        self, server_round: int, before: TensorDict, after: TensorDict, replies: Mapping[int, TrainReply]
    ) -> tuple[TensorDict, dict[str, Any]]:
        """The new global model from the previous one (``before``) and the aggregate (``after``), and its log."""
        raise NotImplementedError
