"""One file per federated algorithm; each holds only its cross-round state (docs/design.md).

The names, defaults and capabilities are in the torch-free leaf `federation.methods` (re-exported
here): one ``StrategySpec`` per strategy in ``SPECS`` (``SPEC`` by name), and the tables derived from them:
``STRATEGIES`` maps a strategy name to its module, ``DEFAULT_NHEAD`` its local layer units when
``strategy.nhead`` is unset, ``WRAPPERS`` the ``strategy.wrap`` steps, ``AVERAGING`` the strategies a wrapper can
post-process, ``EXAMPLE_WEIGHTED`` those that weight by ``n_i / n`` (what ``server.robust = "trimmed_mean"``
replaces). Modules are imported lazily by name, so a strategy that is missing or broken only fails when it is
chosen. Each module exposes ``build(config: RunConfig, ctx: StrategyContext) -> Strategy`` (the ``Strategy``
protocol of ``federation.wire.contract``); each wrapper ``wrap(inner: Strategy, config: RunConfig, ctx: StrategyContext)
-> Strategy``, applied in the listed order.
``StrategyContext`` (`federation.strategies.context`, which imports torch) is imported on first use, so that
importing the registry through this package does not import torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from federation.errors import FederationError
from federation.methods import (
    AVERAGING,
    DEFAULT_NHEAD,
    EXAMPLE_WEIGHTED,
    FORCED_BN,
    OWN_START,
    SPEC,
    SPECS,
    STRATEGIES,
    STRATEGY_NAMES,
    WRAPPER_NAMES,
    WRAPPERS,
    StrategySpec,
    bn_mode,
    default_nhead,
    wrap_problem,
)

if TYPE_CHECKING:
    from federation.config import RunConfig
    from federation.strategies.context import StrategyContext
    from federation.wire.contract import Strategy


def __getattr__(name: str) -> Any:
    """``StrategyContext`` from `federation.strategies.context` (torch) on first use (PEP 562)."""
    if name == "StrategyContext":
        from federation.strategies.context import StrategyContext

        return StrategyContext
    raise AttributeError(f"module 'federation.strategies' has no attribute {name!r}")


def _import(kind: str, name: str, module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise FederationError(f"{kind} {name!r} is not available in this installation ({exc.name} missing)") from exc


def build_strategy(config: RunConfig, ctx: StrategyContext) -> Strategy:
    """Import the module of ``config.strategy.name``, call its ``build(config, ctx)``, then apply
    ``config.strategy.wrap`` in order."""
    name = config.strategy.name
    if name not in STRATEGIES:
        raise FederationError(f"unknown strategy {name!r}: choose one of {', '.join(STRATEGY_NAMES)}")
    problem = wrap_problem(name, config.strategy.wrap)
    if problem is not None:
        raise FederationError(f"strategy.wrap = {list(config.strategy.wrap)}: {problem}")
    strategy: Strategy = _import("strategy", name, STRATEGIES[name]).build(config, ctx)
    for step in config.strategy.wrap:
        strategy = _import("strategy.wrap step", step, WRAPPERS[step]).wrap(strategy, config, ctx)
    return strategy


__all__ = [
    "AVERAGING",
    "DEFAULT_NHEAD",
    "EXAMPLE_WEIGHTED",
    "FORCED_BN",
    "OWN_START",
    "SPEC",
    "SPECS",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "WRAPPERS",
    "WRAPPER_NAMES",
    "StrategyContext",
    "StrategySpec",
    "bn_mode",
    "build_strategy",
    "default_nhead",
    "wrap_problem",
]
