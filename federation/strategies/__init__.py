"""One file per federated algorithm; each holds only its cross-round state (DESIGN.md).

The registry maps a strategy name to its module. Modules are imported lazily by name, so a strategy that is
missing or broken only fails when it is chosen. Each module exposes
``build(config: RunConfig, ctx: StrategyContext) -> Strategy`` (the ``Strategy`` protocol of
``federation.contract``). ``DEFAULT_NHEAD`` gives each strategy's number of local layer units when the
configuration leaves ``strategy.nhead`` unset: FedRep and depth-wise FIM (paper 000, FedPer/FedAS-style) keep
the last unit (the classifier) local, FedSAF the last six units (paper 001, Sec. 4.3.3, Table 6), the others
share everything.

``WRAPPERS`` maps ``strategy.wrap`` names to modules in ``wrappers/`` that post-process the new global model of
an averaging strategy (FedLWS, paper 002; FedTLU, paper 003). Each exposes
``wrap(inner: Strategy, config: RunConfig, ctx: StrategyContext) -> Strategy``; they apply in the listed order.
Only strategies in ``AVERAGING`` keep one global model for a wrapper to rescale or revert.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
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
    "depthwise_fim": "federation.strategies.depthwise_fim",
    "precision_weighted": "federation.strategies.precision_weighted",
    "fedbn": "federation.strategies.fedbn",
    "fedas": "federation.strategies.fedas",
}
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)

DEFAULT_NHEAD: dict[str, int] = {
    "separate": 0,
    "fedavg": 0,
    "fedprox": 0,
    "fedrep": 1,
    "fedamp": 0,
    "fedsaf": 6,
    "depthwise_fim": 1,
    "precision_weighted": 0,
    "fedbn": 0,
    "fedas": 1,
}

# Strategies that give each hospital a centre of its own to be pulled toward: client.start = "own" applies.
OWN_START: frozenset[str] = frozenset({"fedamp", "fedsaf"})
# Where BatchNorm lives when a method fixes it (FedBN keeps statistics and affine parameters at each hospital).
FORCED_BN: dict[str, str] = {"fedbn": "local"}

WRAPPERS: dict[str, str] = {
    "fedlws": "federation.strategies.wrappers.fedlws",
    "fedtlu": "federation.strategies.wrappers.fedtlu",
}
WRAPPER_NAMES: tuple[str, ...] = tuple(WRAPPERS)

# Strategies whose server state is one global model averaged from the clients' models.
AVERAGING: frozenset[str] = frozenset(
    {"fedavg", "fedprox", "fedrep", "depthwise_fim", "precision_weighted", "fedbn", "fedas"}
)


def bn_mode(name: str, configured: str) -> str:
    """Where BatchNorm lives for strategy ``name``: its own fixed choice, else ``strategy.bn``."""
    return FORCED_BN.get(name, configured)


def default_nhead(name: str) -> int:
    """The number of local layer units ``name`` uses when ``strategy.nhead`` is not set."""
    return DEFAULT_NHEAD.get(name, 0)


def wrap_problem(name: str, wrap: Sequence[str]) -> str | None:
    """Why ``strategy.wrap = wrap`` cannot post-process strategy ``name`` (``None`` when it can)."""
    unknown = [w for w in wrap if w not in WRAPPERS]
    if unknown:
        return f"unknown step(s) {', '.join(map(repr, unknown))}: use any of {', '.join(WRAPPER_NAMES)}"
    if len(set(wrap)) != len(wrap):
        return "list each step once"
    if wrap and name not in AVERAGING:
        averaging = ", ".join(n for n in STRATEGY_NAMES if n in AVERAGING)
        return (
            f"strategy {name} keeps no averaged global model for {' and '.join(wrap)} to post-process "
            f"(it shares nothing, or gives each client its own centre): wrap one of {averaging}"
        )
    return None


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
    "STRATEGIES",
    "STRATEGY_NAMES",
    "WRAPPERS",
    "WRAPPER_NAMES",
    "StrategyContext",
    "build_strategy",
    "default_nhead",
    "wrap_problem",
]
