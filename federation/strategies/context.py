"""What every strategy is built from: the run's context and the client recipe from the configuration.

``StrategyContext`` carries what a server may know before round 1 (FedSAF paper 001, Algorithm 1, Step 1):
the participating hospitals and their example counts, the model's ``state_dict`` keys, its ordered layer units
(``models.split_units``, the Eq. 1 split) and the common initial weights. Strategies keep their own
cross-round state; nothing here is mutable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from federation.bounds import max_weight_problem
from federation.errors import FederationError
from federation.methods import default_nhead, split_on
from federation.strategies.aggregation import cap_weights
from federation.wire.contract import Recipe, TensorDict, TrainReply
from models import Unit, base_keys

if TYPE_CHECKING:
    from federation.config import RunConfig


@dataclass(frozen=True)
class StrategyContext:
    """The federation as the server sees it at the start.

    ``hospitals``: participating hospital indices (manifest numbering, ascending). ``num_examples[c]``: hospital
    ``c``'s training tiles. ``state_keys``/``units``: the model's ``state_dict`` keys and its layer units,
    input to output. ``initial_state``: the weights every hospital starts from (identical for all hospitals).
    ``local_keys``: keys that stay at every hospital whatever ``nhead`` (``strategy.bn``: BatchNorm statistics,
    and affine parameters with ``bn = "local"``), applied the same way to every method.
    """

    hospitals: tuple[int, ...]
    num_examples: Mapping[int, int]
    state_keys: tuple[str, ...]
    units: tuple[Unit, ...]
    initial_state: Mapping[str, torch.Tensor]
    local_keys: frozenset[str] = frozenset()

    @property
    def num_hospitals(self) -> int:
        return len(self.hospitals)

    def shared_keys(self, nhead: int) -> list[str]:
        """Keys of every unit but the last ``nhead``, less ``local_keys`` (``ModelError`` for a bad ``nhead``)."""
        return [k for k in base_keys(self.units, nhead) if k not in self.local_keys]

    def initial(self, keys: list[str]) -> TensorDict:
        """Copies of the initial weights for ``keys``."""
        return {k: self.initial_state[k].detach().clone() for k in keys}


def resolved_nhead(config: RunConfig) -> int:
    """``strategy.nhead`` after the engine resolved it (it is never ``None`` once a run starts)."""
    nhead = config.strategy.nhead
    return default_nhead(config.strategy.name) if nhead is None else nhead


def shared_nhead(config: RunConfig) -> int:
    """How many output-side layer units a run keeps at each hospital (FedSAF paper 001, Eq. 1): ``strategy.nhead``
    as resolved, except where the method's split is switched off (`split_on`: FedSAF with ``fedsaf.split =
    false``), which shares everything (0)."""
    return resolved_nhead(config) if split_on(config) else 0


def recipe_from_config(
    config: RunConfig,
    *,
    head_epochs: int = 0,
    prox_mu: float = 0.0,
    fisher_batch: int = 0,
    second_moments: bool = False,
) -> Recipe:
    """The ``[client]`` (and ``[adam]``) sections as a ``Recipe``, with the strategy's own head/proximal/Fisher
    and second-moment choices."""
    hospital = config.client
    recipe = Recipe(
        epochs=hospital.epochs,
        lr=hospital.lr,
        head_epochs=head_epochs,
        head_lr=hospital.head_lr if hospital.head_lr is not None else hospital.lr,
        prox_mu=prox_mu,
        fisher_batch=fisher_batch,
        momentum=hospital.momentum,
        weight_decay=hospital.weight_decay,
        precise_bn=hospital.precise_bn,
        optimizer=hospital.optimizer,
        adam_beta1=config.adam.beta1,
        adam_beta2=config.adam.beta2,
        adam_eps=config.adam.eps,
        second_moments=second_moments,
        fisher_estimator=config.fedsaf.fisher_estimator,
        start_own=hospital.start == "own",
    )
    return with_privacy(recipe, config)


def with_privacy(recipe: Recipe, config: RunConfig) -> Recipe:
    """``recipe`` with its ``dp_*`` fields from ``[privacy]`` (unchanged when it is off, so a run without DP sends
    the recipe it always sent)."""
    privacy = config.privacy
    if not privacy.enabled:
        return recipe
    assert privacy.noise_multiplier is not None
    assert privacy.max_grad_norm is not None
    assert privacy.sample_rate is not None
    return replace(
        recipe,
        dp_noise_multiplier=privacy.noise_multiplier,
        dp_max_grad_norm=privacy.max_grad_norm,
        dp_sample_rate=privacy.sample_rate,
        dp_unit=privacy.unit or "slide",
        dp_tiles_per_unit=privacy.tiles_per_unit or 8,
        dp_delta=privacy.run_delta,
    )


def state_dict_subset(state: Mapping[str, torch.Tensor], keys: list[str]) -> TensorDict:
    """Detached copies of ``state[k]`` for ``keys``, in that order."""
    return {k: state[k].detach().clone() for k in keys}


def example_weights(server_round: int, replies: Mapping[int, TrainReply], hospitals: Sequence[int]) -> list[float]:
    """FedAvg's weights ``n_i / n`` of ``hospitals`` from their reported training examples (none at all: an error)."""
    counts = [replies[c].num_examples for c in hospitals]
    total = sum(counts)
    if total <= 0:
        raise FederationError(f"round {server_round}: the hospitals reported no training examples")
    return [n / total for n in counts]


def cap_example_weights(
    weights: Sequence[float], hospitals: Sequence[int], max_weight: float
) -> tuple[list[float], dict[str, Any]]:
    """One weight per hospital of ``hospitals`` (FedAvg's ``n_i / n``, or the Fisher weights gamma of FedSAF and FedAS)
    capped at ``server.max_weight`` (`federation.strategies.aggregation.cap_weights`), and what ``aggregation.jsonl``
    records of
    it as ``weight_cap``: the cap, the hospitals whose weight it lowered, and ``uniform``.

    The cap was checked against the run's ``m`` hospitals when the run started; a round in which some were left out
    has ``m' < m`` weights, and a cap below ``1/m'`` cannot hold: that round every replying hospital gets ``1/m'``
    (the most even weights there are) and ``uniform`` is true.
    """
    m = len(weights)
    uniform = max_weight_problem(m, max_weight) is not None
    used = [1.0 / m] * m if uniform else cap_weights(weights, max_weight).tolist()
    lowered = [str(c) for c, before, after in zip(hospitals, weights, used, strict=True) if after < before]
    return used, {"max_weight": max_weight, "capped": lowered, "uniform": uniform}


def fisher_traces(
    server_round: int, replies: Mapping[int, TrainReply], hospitals: Sequence[int], needed: str
) -> list[float]:
    """Each client's reported ``metrics["fisher_trace"]``, in ``hospitals`` order.

    A client that sent none is an error; ``needed`` completes its message with why the strategy needs it.
    """
    traces = []
    for c in hospitals:
        trace = replies[c].metrics.get("fisher_trace")
        if trace is None:
            raise FederationError(f"round {server_round}: hospital {c} sent no fisher_trace{needed}")
        traces.append(float(trace))
    return traces
