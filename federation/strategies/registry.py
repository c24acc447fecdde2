"""The strategy registry: every algorithm's name, its defaults and what it can do, without importing torch.

A leaf module (it imports nothing of this project), read by the run configuration's checks
(`federation.config`), by `federation.strategies` (which imports a strategy's module when it is built) and by
the dashboard's form, so that checking settings never waits on torch.

``STRATEGIES`` maps a name to the module that builds it (``build(config, ctx) -> Strategy``). ``DEFAULT_NHEAD``
gives each strategy's number of local layer units when ``strategy.nhead`` is unset: FedRep and depth-wise FIM
(paper 000, FedPer/FedAS-style) keep the last unit (the classifier) local, FedSAF the last six units (paper 001,
Sec. 4.3.3, Table 6), the others share everything. ``WRAPPERS`` maps ``strategy.wrap`` names to the modules in
``wrappers/`` that post-process an averaging strategy's new global model (FedLWS, paper 002; FedTLU, paper 003);
only strategies in ``AVERAGING`` keep one global model for a wrapper to rescale or revert. ``EXAMPLE_WEIGHTED``:
the strategies whose aggregation weights are the example-count weights ``n_i / n``, the only ones
``server.max_weight`` caps.
"""

from __future__ import annotations

from collections.abc import Sequence

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

# Strategies that aggregate with FedAvg's weights n_i / n (federation.strategies.fedavg.Averaging), so that
# server.max_weight caps them. Not the others: fedas and depthwise_fim weight by Fisher traces, precision_weighted by
# Adam's second moments (n_i / n only for buffers and as a fallback), fedamp and fedsaf by AMP's xi and Fisher's gamma.
EXAMPLE_WEIGHTED: frozenset[str] = frozenset({"fedavg", "fedprox", "fedrep", "fedbn"})


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
