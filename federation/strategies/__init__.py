"""One file per federated algorithm; each holds only its cross-round state (DESIGN.md).

The registry maps a strategy name to its module. Modules are imported lazily by name, so a strategy that is
missing or broken only fails when it is chosen. Each module exposes
``build(config: RunConfig, ctx: StrategyContext) -> Strategy`` (the ``Strategy`` protocol of
``federation.contract``). ``DEFAULT_NHEAD`` gives each strategy's number of local layer units when the
configuration leaves ``strategy.nhead`` unset: FedRep keeps the last unit (the classifier) local, FedSAF the
last six units (paper 001, Sec. 4.3.3, Table 6), the others share everything.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from federation.errors import FederationError
from federation.strategies.common import StrategyContext

if TYPE_CHECKING:
    from federation.config import RunConfig
    from federation.contract import Strategy

STRATEGIES: dict[str, str] = {
    "separate": "federation.strategies.separate",
    "fedavg": "federation.strategies.fedavg",
    "fedprox": "federation.strategies.fedprox",
    "fedrep": "federation.strategies.fedrep",
    "fedamp": "federation.strategies.fedamp",
    "fedsaf": "federation.strategies.fedsaf",
}
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)

DEFAULT_NHEAD: dict[str, int] = {"separate": 0, "fedavg": 0, "fedprox": 0, "fedrep": 1, "fedamp": 0, "fedsaf": 6}


def default_nhead(name: str) -> int:
    """The number of local layer units ``name`` uses when ``strategy.nhead`` is not set."""
    return DEFAULT_NHEAD.get(name, 0)


def build_strategy(config: RunConfig, ctx: StrategyContext) -> Strategy:
    """Import the module of ``config.strategy.name`` and call its ``build(config, ctx)``."""
    name = config.strategy.name
    if name not in STRATEGIES:
        raise FederationError(f"unknown strategy {name!r}: choose one of {', '.join(STRATEGY_NAMES)}")
    try:
        module = importlib.import_module(STRATEGIES[name])
    except ModuleNotFoundError as exc:
        if exc.name != STRATEGIES[name]:
            raise
        raise FederationError(f"strategy {name!r} is not available in this installation ({exc.name} missing)") from exc
    strategy: Strategy = module.build(config, ctx)
    return strategy


__all__ = ["STRATEGIES", "STRATEGY_NAMES", "StrategyContext", "build_strategy", "default_nhead"]
