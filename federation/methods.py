"""The strategy registry: every algorithm's name, its defaults and what it can do, without importing torch.

A leaf module (it imports nothing of this project), read by the run configuration's checks
(`federation.config`), by `federation.strategies` (which imports a strategy's module when it is built) and by
the dashboard's form, so that checking settings never waits on torch. It sits beside, not inside,
`federation/strategies/`: the configuration reads it without loading the strategies package, whose modules import
the configuration (no import loop between the two).

Each strategy is one `StrategySpec` in ``SPECS``; every other table here is derived from them. Adding a strategy
is its module (``build(config, ctx) -> Strategy``) plus one spec; settings of its own are declared in the spec too
(`Setting`, ``StrategySpec.section``), and the configuration and the dashboard's form are built from them
(docs/extending.md). ``WRAPPERS`` maps ``strategy.wrap`` names to
the modules in ``wrappers/`` that post-process an averaging strategy's new global model (FedLWS, paper 002;
FedTLU, paper 003).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Value = bool | int | float | str  # what a declared setting holds
_SETTING_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Setting:
    """One setting of a method's own section ``[<method>]``, declared in its spec (``StrategySpec.section``).

    From the declaration alone the configuration gets the section (`federation.config.sections`: a frozen
    dataclass with this field, read as ``config.section("<method>").<name>``), its default in ``DEFAULTS_TOML`` and
    in every ``config.toml``, the range check when a configuration loads (``problem``), and the refusal of a value
    changed from the default when another method runs (it would silently do nothing); the dashboard's form gets a
    field shown for this method alone, with this label, help and limits (`app.dashboard.fields`).

    ``default`` gives the type as well: ``bool``, ``int``, ``float`` (write ``1.0``, not ``1``) or ``str``, which
    needs ``choices`` (the values allowed). ``minimum`` and ``maximum`` bound a number, inclusive unless
    ``minimum_excluded``/``maximum_excluded`` (``> 0`` rather than ``>= 0``); a float must also be finite.
    ``help`` is the form's tooltip and the comment above the default; ``label`` names the form's field (``name``
    when empty); ``step`` is the form's increment. A declaration that cannot work (a default outside its own
    range, bounds on a string) fails when this module is imported, naming the setting.
    """

    name: str
    default: Value
    help: str
    label: str = ""
    minimum: float | None = None
    maximum: float | None = None
    minimum_excluded: bool = False
    maximum_excluded: bool = False
    choices: tuple[str, ...] = ()
    step: float | None = None

    def __post_init__(self) -> None:
        wrong = self._declaration_problem()
        if wrong is not None:
            raise ValueError(f"setting {self.name!r} = {self.default!r}: {wrong}")

    def _declaration_problem(self) -> str | None:
        if not _SETTING_NAME.match(self.name):
            return "name it in lower case letters, digits and '_', starting with a letter"
        if self.kind not in (bool, int, float, str):
            return "give a default of type bool, int, float or str"
        if (self.kind is str) != bool(self.choices):
            return "a string setting lists its choices, and only a string setting has choices"
        numeric = self.kind in (int, float)
        if not numeric and (self.minimum is not None or self.maximum is not None):
            return "only a number has bounds"
        if self.minimum is not None and self.maximum is not None and not self.minimum <= self.maximum:
            return "the minimum is above the maximum"
        need = self.problem(self.default)
        return None if need is None else f"the default is outside the declared range: {need}"

    @property
    def kind(self) -> type:
        """The setting's type, the type of its default."""
        return type(self.default)

    def problem(self, value: Value) -> str | None:
        """What to use instead when ``value`` (already of the setting's type) is outside the declared range, in
        the configuration's words (``use a finite value in [0.0, 1.0]``); ``None`` when it is allowed."""
        if self.choices:
            return None if value in self.choices else f"use one of {', '.join(self.choices)}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        low, high = self.minimum, self.maximum
        inside = (
            math.isfinite(value)
            and (low is None or (value > low if self.minimum_excluded else value >= low))
            and (high is None or (value < high if self.maximum_excluded else value <= high))
        )
        if inside:
            return None
        if low is not None and high is not None:
            bounds = f" in {'(' if self.minimum_excluded else '['}{low}, {high}{')' if self.maximum_excluded else ']'}"
        elif low is not None:
            bounds = f" {'>' if self.minimum_excluded else '>='} {low}"
        elif high is not None:
            bounds = f" {'<' if self.maximum_excluded else '<='} {high}"
        else:
            bounds = ""
        return f"use a {'finite ' if self.kind is float else ''}value{bounds}"


@dataclass(frozen=True)
class StrategySpec:
    """One federated algorithm's facts, in one place.

    ``default_nhead``: its local layer units when ``strategy.nhead`` is unset (FedRep, depth-wise FIM and FedAS
    keep the classifier local, FedSAF the last six units: paper 001, Sec. 4.3.3, Table 6; the others share
    everything). ``splits``: it reads ``strategy.nhead``. ``head_first``: it trains a personal head before the
    shared part (``client.head_epochs``). ``fisher``: it asks the hospitals for a Fisher trace. ``own_start``: it
    gives each hospital a centre of its own to be pulled toward (``client.start = "own"`` applies). ``forced_bn``:
    where BatchNorm lives when the method fixes it (FedBN: ``"local"``). ``averaging``: its server state is one global
    model averaged from the hospitals' (a ``strategy.wrap`` step can post-process it). ``example_weighted``: it
    aggregates with FedAvg's weights ``n_i / n`` (``federation.strategies.fedavg.Averaging``), which
    ``server.robust = "trimmed_mean"`` replaces. ``shares``: anything leaves the hospital at all (else
    ``server.max_weight`` has nothing to cap). ``min_nhead``: the fewest local units it works with (FedRep needs a
    head of its own: 1); ``fixed_nhead``: the only ``nhead`` it accepts (FedAMP shares the whole model: 0).
    ``optimizer``: the only ``client.optimizer`` it works with (precision-weighted FL reads Adam's second moments,
    paper 004), with the reason in ``optimizer_reason``.
    ``settings``: the ``section.key`` settings that only it reads (its own section's, e.g. ``fedprox.mu``), which
    the dashboard's form shows for it alone.
    ``section``: the settings of its own section ``[<name>]``, declared here (`Setting`): the configuration and the
    dashboard's form are built from them, so a new method with settings of its own changes no other file. The
    sections written out in `federation.config.sections` (``[fedprox]``, ``[fedamp]``, ...) came before; ``owned``
    lists both kinds.
    ``split_switch``: the boolean setting that turns its split off (FedSAF's ``fedsaf.split``, the paper's
    "split" ablation of Table 4): false shares every unit whatever ``strategy.nhead``.
    ``paired_reference``: every other method of an ablation grid is compared with it, paired by seed, when the grid
    has it (``federation.ablation.paired``: local training alone and FedAvg, the baselines of paper 001's tables).
    ``menu_rank``: its place in the dashboard's picker; ``short_name`` is used in sentences, ``display_name`` in the
    picker. The strategies' own checks and the dashboard's read these, so a rule
    is written once.
    """

    name: str
    module: str
    short_name: str
    display_name: str
    menu_rank: int
    default_nhead: int = 0
    splits: bool = True
    head_first: bool = False
    fisher: bool = False
    own_start: bool = False
    forced_bn: str | None = None
    averaging: bool = False
    example_weighted: bool = False
    shares: bool = True
    min_nhead: int = 0
    fixed_nhead: int | None = None
    split_switch: str | None = None
    optimizer: str | None = None
    optimizer_reason: str = ""
    settings: tuple[str, ...] = ()
    paired_reference: bool = False
    section: tuple[Setting, ...] = ()

    def __post_init__(self) -> None:
        names = [s.name for s in self.section]
        if len(set(names)) != len(names):
            raise ValueError(f"strategy {self.name}: its section declares a setting twice ({', '.join(names)})")

    @property
    def owned(self) -> tuple[str, ...]:
        """Every ``section.key`` that only this method reads: ``settings`` and its declared section's keys."""
        return (*self.settings, *(f"{self.name}.{s.name}" for s in self.section))


SPECS: tuple[StrategySpec, ...] = (
    StrategySpec(
        "separate",
        "federation.strategies.separate",
        "Separate (local training only)",
        "Separate (local training only)",
        5,
        splits=False,
        shares=False,
        paired_reference=True,
    ),
    StrategySpec(
        "fedavg",
        "federation.strategies.fedavg",
        "FedAvg",
        "FedAvg",
        2,
        averaging=True,
        example_weighted=True,
        paired_reference=True,
    ),
    StrategySpec(
        "fedprox",
        "federation.strategies.fedprox",
        "FedProx",
        "FedProx",
        3,
        averaging=True,
        example_weighted=True,
        settings=("fedprox.mu",),
    ),
    StrategySpec(
        "fedrep",
        "federation.strategies.fedrep",
        "FedRep",
        "FedRep (shared base, local head)",
        4,
        default_nhead=1,
        head_first=True,
        averaging=True,
        example_weighted=True,
        min_nhead=1,
    ),
    StrategySpec(
        "fedamp",
        "federation.strategies.fedamp",
        "FedAMP",
        "FedAMP (attentive message passing)",
        1,
        splits=False,
        own_start=True,
        fixed_nhead=0,
        settings=("fedamp.dm",),
    ),
    StrategySpec(
        "fedsaf",
        "federation.strategies.fedsaf",
        "FedSAF",
        "FedSAF (split + AMP + Fisher)",
        0,
        default_nhead=6,
        head_first=True,
        fisher=True,
        own_start=True,
        split_switch="fedsaf.split",
        settings=("amp.dm", "fedsaf.fim", "fedsaf.split"),
    ),
    StrategySpec(
        "depthwise_fim",
        "federation.strategies.depthwise_fim",
        "depth-wise FIM",
        "Depth-wise FIM (paper 000)",
        8,
        default_nhead=1,
        fisher=True,
        averaging=True,
        settings=("depthwise_fim.reverse",),
    ),
    StrategySpec(
        "precision_weighted",
        "federation.strategies.precision_weighted",
        "precision-weighted FL",
        "Precision-weighted (paper 004, Adam)",
        9,
        averaging=True,
        optimizer="adam",
        optimizer_reason="it weights hospitals by Adam's second moments (paper 004 uses lr 0.001)",
        settings=("precision_weighted.eps", "precision_weighted.inverse"),
    ),
    StrategySpec(
        "fedbn",
        "federation.strategies.fedbn",
        "FedBN",
        "FedBN (BatchNorm stays local)",
        6,
        forced_bn="local",
        averaging=True,
        example_weighted=True,
    ),
    StrategySpec(
        "fedas",
        "federation.strategies.fedas",
        "FedAS",
        "FedAS (Fisher-weighted averaging)",
        7,
        default_nhead=1,
        fisher=True,
        averaging=True,
    ),
)
SPEC: dict[str, StrategySpec] = {s.name: s for s in SPECS}

# Derived tables (public names other modules and tools use)
STRATEGIES: dict[str, str] = {s.name: s.module for s in SPECS}
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)
DEFAULT_NHEAD: dict[str, int] = {s.name: s.default_nhead for s in SPECS}
OWN_START: frozenset[str] = frozenset(s.name for s in SPECS if s.own_start)
FORCED_BN: dict[str, str] = {s.name: s.forced_bn for s in SPECS if s.forced_bn is not None}
AVERAGING: frozenset[str] = frozenset(s.name for s in SPECS if s.averaging)
# Not the other averaging ones: fedas and depthwise_fim weight by Fisher traces, precision_weighted by Adam's second
# moments (n_i / n only for buffers and as a fallback); nor fedamp and fedsaf (AMP's xi, Fisher's gamma). The
# trimmed mean (server.robust) replaces these weights only; server.max_weight caps every method's.
EXAMPLE_WEIGHTED: frozenset[str] = frozenset(s.name for s in SPECS if s.example_weighted)

WRAPPERS: dict[str, str] = {
    "fedlws": "federation.strategies.wrappers.fedlws",
    "fedtlu": "federation.strategies.wrappers.fedtlu",
}
WRAPPER_NAMES: tuple[str, ...] = tuple(WRAPPERS)


def averaging_names() -> str:
    """The strategies a ``strategy.wrap`` step can post-process, for messages (``fedavg, fedprox, ...``)."""
    return ", ".join(n for n in STRATEGY_NAMES if n in AVERAGING)


def bn_mode(name: str, configured: str) -> str:
    """Where BatchNorm lives for strategy ``name``: its own fixed choice, else ``strategy.bn``."""
    return FORCED_BN.get(name, configured)


def split_on(config: Any) -> bool:
    """Whether a run (a ``federation.config.RunConfig``) splits its method as configured: false when the method's
    ``split_switch`` (FedSAF's ``fedsaf.split``) is set to false, true for every method without one."""
    switch = SPEC[config.strategy.name].split_switch
    if switch is None:
        return True
    section, key = switch.split(".")
    return bool(getattr(config.section(section), key))


def readers(key: str) -> frozenset[str]:
    """The methods whose own setting ``key`` is (`StrategySpec.owned`: its ``settings`` and its declared
    section's); empty for a setting no method owns."""
    return frozenset(spec.name for spec in SPECS if key in spec.owned)


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
        return (
            f"strategy {name} keeps no averaged global model for {' and '.join(wrap)} to post-process "
            f"(it shares nothing, or gives each client its own centre): wrap one of {averaging_names()}"
        )
    return None
