"""The Federation page's settings: which ``gastric-fl train`` settings the form offers, their limits, the checks
that refuse a run before a process starts, and the command line that carries them (``--set section.key=value``).

Every setting is a field of ``federation/config.py`` (``section.key``), and every check is the engine's own:
a field is checked by building its section of the run configuration (``federation.config.SECTIONS``) from the
preset with that one value changed, so each invalid field gets its own message, in the words
``gastric-fl train`` would use; then the whole configuration is loaded exactly as the CLI loads it
(``federation.config.load_config``: the preset, the ``--set`` overrides, ``--data``) for the rules between
fields; then the checks the engine makes when a run starts, before its first round: the AMP bound
``alpha_k x (hospitals - 1) <= sigma`` (``federation.config.amp_bound_problem``; FedSAF paper Eq. 3-8,
16-18: ``A'(x) = exp(-x/sigma)/sigma <= 1/sigma`` keeps ``xi_ii >= 0``), ``nhead`` within the model's layer
units (Eq. 1), the input size the model needs, and the head-first rules of FedRep and FedSAF (Eq. 24).

Nothing here imports torch, the checks included: the strategies' names and defaults come from the registry
(``federation.strategies.registry``), the models' names, input sizes and layer units from ``models.names``, and
the AMP bound from ``federation.config.amp_bound_problem``, all torch-free, so the page settles without waiting
on torch.
"""

from __future__ import annotations

import math
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.config import (
    AMP_METRICS,
    AMP_SCALES,
    BN_MODES,
    DEFAULTS_TOML,
    FISHER_ESTIMATORS,
    OPTIMIZERS,
    STARTS,
    TLU_GROUPINGS,
    amp_bound_problem,
)
from federation.strategies.registry import (
    AVERAGING,
    FORCED_BN,
    OWN_START,
    SPEC,
    SPECS,
    WRAPPER_NAMES,
    default_nhead,
)
from infra.toml import toml_value
from models.errors import ModelError
from models.names import DEFAULT_MODEL, LAYER_UNITS, check_input_size

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PRESETS_DIR = PROJECT_ROOT / "configs"
DEFAULT_PRESET = PRESETS_DIR / "demo.toml"

DEFAULT_UNITS = LAYER_UNITS[DEFAULT_MODEL]

# The methods offered, FedSAF first (the registry's menu order); the short name is used in sentences, the long
# one in the picker. Which settings a method reads comes from its spec (federation.strategies.registry).
ALGORITHMS: tuple[str, ...] = tuple(s.name for s in sorted(SPECS, key=lambda s: s.menu_rank))
SHORT_NAMES: dict[str, str] = {name: SPEC[name].short_name for name in ALGORITHMS}
ALGORITHM_NAMES: dict[str, str] = {name: SPEC[name].display_name for name in ALGORITHMS}
DISTANCES = AMP_METRICS

NHEAD_METHODS = frozenset(s.name for s in SPECS if s.splits)
FISHER_METHODS = frozenset(s.name for s in SPECS if s.fisher)
HEAD_METHODS = frozenset(s.name for s in SPECS if s.head_first)  # train a personal head first (client.head_epochs)
SHARING_METHODS = frozenset(s.name for s in SPECS if s.shares)

GROUPS = {
    "plain": "Settings",
    "method": "The method's hyper-parameters",
    "shared": "Settings every method shares (keep them equal when comparing methods)",
    "training": "Local training",
}


@dataclass(frozen=True)
class Field:
    """One setting of the form: a ``section.key`` of the run configuration, with the widget's limits.

    ``minimum``/``maximum`` bound the number input (never below what the engine accepts; an engine bound that is
    exclusive, such as ``lr > 0``, is enforced by the check and its message). ``methods``: the methods that read
    the setting (``None``: every method); ``when``: a further condition on the other values (e.g. Adam's settings
    only with ``client.optimizer = adam``). A field that does not apply is neither shown nor passed to the engine.
    """

    key: str
    label: str
    kind: str  # "int", "float", "bool", "choice" or "list"
    group: str
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    fmt: str | None = None
    options: tuple[str, ...] = ()
    methods: frozenset[str] | None = None
    when: Callable[[Mapping[str, Any]], bool] | None = field(default=None, compare=False)

    @property
    def section(self) -> str:
        """The ``[section]`` of ``federation/config.py`` it belongs to."""
        return self.key.partition(".")[0]

    @property
    def name(self) -> str:
        """Its key within the section."""
        return self.key.partition(".")[2]

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the chosen method (``values["strategy.name"]``) reads this setting, given the other values."""
        method = str(values.get("strategy.name", ""))
        if self.methods is not None and method not in self.methods:
            return False
        return self.when is None or bool(self.when(values))


def _wraps(step: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda values: step in (values.get("strategy.wrap") or ())


FIELDS: tuple[Field, ...] = (
    Field(
        "strategy.name",
        "Method",
        "choice",
        "plain",
        "The federated algorithm; FedSAF (paper 001) by default.",
        options=ALGORITHMS,
    ),
    Field("run.rounds", "Rounds", "int", "plain", "Federated rounds: train, aggregate, evaluate.", 1, 1000, 1),
    Field("run.seed", "Seed", "int", "plain", "Seeds every random draw (same seed, same numbers).", 0, 10**6, 1),
    Field(
        "client.epochs",
        "Local epochs",
        "int",
        "plain",
        "Epochs each hospital trains on its own tiles per round (FedSAF/FedRep: after the head epochs).",
        0,
        100,
        1,
    ),
    Field("client.lr", "Learning rate", "float", "plain", "SGD step size at every hospital.", 0.0, 10.0, 0.001, "%.4f"),
    # -- the method's own ---------------------------------------------------------------------------------------
    Field(
        "strategy.nhead",
        "nhead (layer units kept at the hospital)",
        "int",
        "method",
        "Layer units, counted from the output, that stay in the hospital and never travel (paper Eq. 1).",
        0,
        None,
        1,
        methods=NHEAD_METHODS,
    ),
    Field(
        "amp.dm",
        "Distance dm",
        "choice",
        "method",
        "How alike two hospitals' shared layers are (paper Eq. 3-8); cosine feeds the similarity as the paper "
        "writes it, cosine_distance uses 1 - similarity.",
        options=AMP_METRICS,
        methods=frozenset({"fedsaf"}),
    ),
    Field(
        "fedamp.dm",
        "Distance dm",
        "choice",
        "method",
        "FedAMP's own distance (squared L2 in Huang et al. 2021).",
        options=AMP_METRICS,
        methods=frozenset({"fedamp"}),
    ),
    Field(
        "amp.sigma",
        "sigma",
        "float",
        "method",
        "Width of the attention A'(x) = exp(-x/sigma)/sigma (paper Eq. 10).",
        0.0,
        1000.0,
        0.01,
        "%.4f",
        methods=OWN_START,
    ),
    Field(
        "amp.alpha_k",
        "alpha_k",
        "float",
        "method",
        "Message-passing step; alpha_k x (hospitals - 1) must not exceed sigma.",
        0.0,
        1000.0,
        0.005,
        "%.4f",
        methods=OWN_START,
    ),
    Field(
        "amp.lam",
        "lambda",
        "float",
        "method",
        "Pull of each hospital's shared layers toward its message (paper Eq. 25).",
        0.0,
        1000.0,
        0.01,
        "%.3f",
        methods=OWN_START,
    ),
    Field(
        "amp.scale",
        "Distance scale",
        "choice",
        "method",
        "relative divides each distance by the round's mean (docs/fedsaf.md); raw is the paper's.",
        options=AMP_SCALES,
        methods=OWN_START,
    ),
    Field(
        "fedsaf.fim", "Fisher reweighting (FIM)", "bool", "method", "Paper Eq. 19-20.", methods=frozenset({"fedsaf"})
    ),
    Field(
        "fedsaf.split",
        "Model splitting",
        "bool",
        "method",
        "Off: nhead = 0, everything is shared.",
        methods=frozenset({"fedsaf"}),
    ),
    Field(
        "fedsaf.fisher_batch",
        "Fisher mini-batch",
        "int",
        "method",
        "Tiles per estimate of the Fisher trace (paper Eq. 12-15).",
        1,
        4096,
        1,
        methods=FISHER_METHODS,
    ),
    Field(
        "client.head_epochs",
        "Head epochs",
        "int",
        "method",
        "Epochs on the personal head before the base, each round (paper Eq. 24).",
        0,
        100,
        1,
        methods=HEAD_METHODS,
    ),
    Field(
        "fedprox.mu",
        "mu",
        "float",
        "method",
        "FedProx's proximal strength.",
        0.0,
        1000.0,
        0.001,
        "%.4f",
        methods=frozenset({"fedprox"}),
    ),
    Field(
        "depthwise_fim.reverse",
        "Reverse",
        "bool",
        "method",
        "Paper 000's ablation: the input side aggregates every hospital, the output side only the top ones.",
        methods=frozenset({"depthwise_fim"}),
    ),
    Field(
        "precision_weighted.eps",
        "epsilon",
        "float",
        "method",
        "Added to Adam's second moments before weighting (paper 004, Eq. 6).",
        0.0,
        1.0,
        1e-7,
        "%.2e",
        methods=frozenset({"precision_weighted"}),
    ),
    Field(
        "precision_weighted.inverse",
        "Inverse weighting",
        "bool",
        "method",
        "Weights proportional to 1 / (v + eps), as the paper reads; off weights by v + eps.",
        methods=frozenset({"precision_weighted"}),
    ),
    # -- shared by every method: keep equal when comparing -------------------------------------------------------
    Field(
        "strategy.bn",
        "BatchNorm",
        "choice",
        "shared",
        "shared: statistics and affine parameters travel; local_stats: statistics stay (PFLlib); local: both "
        "stay (FedBN).",
        options=BN_MODES,
        methods=SHARING_METHODS - set(FORCED_BN),
    ),
    Field(
        "client.start",
        "Where a hospital starts its round",
        "choice",
        "shared",
        "centre: from the server's centre; own: from its own model, pulled toward the centre.",
        options=STARTS,
        methods=OWN_START,
    ),
    Field(
        "fedsaf.fisher_estimator",
        "Fisher estimator",
        "choice",
        "shared",
        "per_sample: mean squared per-sample gradient norm on a mini-batch; full_pass: FedAS's pass over all "
        "training batches.",
        options=FISHER_ESTIMATORS,
        methods=FISHER_METHODS,
    ),
    Field(
        "strategy.wrap",
        "Post-processing steps",
        "list",
        "shared",
        "Applied to the averaged model, in order: FedLWS (paper 002), FedTLU (paper 003).",
        options=WRAPPER_NAMES,
        methods=AVERAGING,
    ),
    Field(
        "fedlws.beta",
        "FedLWS beta",
        "float",
        "shared",
        "Strength of the layer-wise shrinking (0.001-0.1).",
        0.0,
        10.0,
        0.001,
        "%.4f",
        methods=AVERAGING,
        when=_wraps("fedlws"),
    ),
    Field(
        "fedtlu.portion",
        "FedTLU portion",
        "float",
        "shared",
        "Share of each group's blocks updated per round, in (0, 1].",
        0.0,
        1.0,
        0.05,
        "%.2f",
        methods=AVERAGING,
        when=_wraps("fedtlu"),
    ),
    Field(
        "fedtlu.grouping",
        "FedTLU grouping",
        "choice",
        "shared",
        "body: the model's main body is one group; shapes: the paper's grouping by parameter shape.",
        options=TLU_GROUPINGS,
        methods=AVERAGING,
        when=_wraps("fedtlu"),
    ),
    Field("client.optimizer", "Optimiser", "choice", "shared", "precision-weighted FL needs adam.", options=OPTIMIZERS),
    Field(
        "adam.beta1",
        "Adam beta1",
        "float",
        "shared",
        "In [0, 1).",
        0.0,
        0.9999,
        0.001,
        "%.4f",
        when=lambda v: v.get("client.optimizer") == "adam",
    ),
    Field(
        "adam.beta2",
        "Adam beta2",
        "float",
        "shared",
        "In [0, 1).",
        0.0,
        0.9999,
        0.0001,
        "%.4f",
        when=lambda v: v.get("client.optimizer") == "adam",
    ),
    Field(
        "adam.eps",
        "Adam epsilon",
        "float",
        "shared",
        "Greater than 0.",
        0.0,
        1.0,
        1e-7,
        "%.2e",
        when=lambda v: v.get("client.optimizer") == "adam",
    ),
    # -- local training ------------------------------------------------------------------------------------------
    Field(
        "client.momentum",
        "Momentum",
        "float",
        "training",
        "SGD momentum, in [0, 1).",
        0.0,
        0.999,
        0.01,
        "%.3f",
        when=lambda v: v.get("client.optimizer") != "adam",
    ),
    Field("client.weight_decay", "Weight decay", "float", "training", "L2 penalty.", 0.0, 1.0, 0.0001, "%.5f"),
    Field("data.batch_size", "Batch size", "int", "training", "At least 2 (BatchNorm).", 2, 4096, 1),
    Field("data.input_size", "Input size (px)", "int", "training", "Tiles are resized to this side.", 16, 1024, 8),
    Field("data.augment", "Augment tiles", "bool", "training", "Random flips and rotations while training."),
    Field(
        "client.precise_bn",
        "Recompute BatchNorm statistics",
        "bool",
        "training",
        "After local training, over the hospital's training tiles.",
    ),
)
FIELDS_BY_KEY: dict[str, Field] = {f.key: f for f in FIELDS}


# --- presets ------------------------------------------------------------------------------------------------------


def _train_sections() -> set[str]:
    from federation.config import SECTIONS

    return set(SECTIONS)


def presets() -> list[Path]:
    """The training presets in ``configs/`` (the demo first); presets of other commands (prepare) are skipped."""
    if not PRESETS_DIR.is_dir():
        return []
    sections = _train_sections()
    found = []
    for path in sorted(PRESETS_DIR.glob("*.toml")):
        try:
            tables = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue
        if tables and set(tables) <= sections:
            found.append(path)
    return sorted(found, key=lambda p: (p != DEFAULT_PRESET, p.name))


def resolve_preset(path: Path | None) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The engine's defaults (``federation.config.DEFAULTS_TOML``) updated by the preset file, as a nested dict,
    and a one-line problem when the file cannot be read (then the defaults alone). Nothing is validated here."""
    resolved: dict[str, dict[str, Any]] = {k: dict(v) for k, v in tomllib.loads(DEFAULTS_TOML).items()}
    if path is None:
        return resolved, None
    try:
        loaded = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return resolved, f"{path} cannot be read as TOML ({exc}); the engine's defaults are shown"
    for section, values in loaded.items():
        if isinstance(values, dict):
            resolved.setdefault(section, {}).update(values)
    return resolved, None


def model_units(model_name: str) -> int:
    """How many layer units the model has (``models.names.LAYER_UNITS``), the upper bound of ``nhead``; the
    default model's for a name the registry does not know (the configuration check names that problem)."""
    return LAYER_UNITS.get(model_name, DEFAULT_UNITS)


def model_of(resolved: Mapping[str, Any]) -> str:
    """The architecture a resolved preset trains."""
    table = resolved.get("model")
    return str(table.get("name")) if isinstance(table, Mapping) and table.get("name") else DEFAULT_MODEL


def baseline(resolved: Mapping[str, Any], key: str, method: str) -> Any:
    """What the engine would use for ``key`` if the form did not pass it: the preset's value, else the default
    (``strategy.nhead``: the method's own)."""
    section, _, name = key.partition(".")
    table = resolved.get(section)
    if isinstance(table, Mapping) and name in table:
        return table[name]
    if key == "strategy.nhead":
        return default_nhead(method)
    return None


def initial_values(resolved: Mapping[str, Any], method: str | None = None) -> dict[str, Any]:
    """The form's starting values: the preset's (resolved), ``strategy.name`` replaced by ``method`` if given."""
    chosen = method or str(baseline(resolved, "strategy.name", "fedsaf") or "fedsaf")
    values = {f.key: baseline(resolved, f.key, chosen) for f in FIELDS}
    values["strategy.name"] = chosen
    return values


def limits(item: Field, units: int) -> tuple[float | None, float | None]:
    """The number input's minimum and maximum (``strategy.nhead`` goes up to the model's layer units)."""
    if item.key == "strategy.nhead":
        return 0, units
    return item.minimum, item.maximum


# --- checks -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checked:
    """The outcome of the checks: one message per invalid field (``field`` key -> sentence, in form order), and
    the problems that belong to no single field (the dataset, the preset, a rule between settings)."""

    fields: dict[str, str]
    general: list[str]

    @property
    def ok(self) -> bool:
        """Whether the run may start."""
        return not self.fields and not self.general

    def messages(self) -> list[str]:
        """Every problem, one sentence each: fields first (named by their label), then the rest."""
        return [*self.fields.values(), *self.general]


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _field_message(item: Field, value: Any, error: str) -> str:
    """The engine's ``config s.k = v is out of range: need`` as ``Label = v: need``."""
    marker = f"config {item.key} = "
    if error.startswith(marker) and ": " in error[len(marker) :]:
        need = error[len(marker) :].split(": ", 1)[1]
        return f"{item.label} = {_shown(value)}: {need}."
    return f"{item.label}: {error}"


def _typed(item: Field, value: Any) -> Any:
    if item.kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if item.kind == "list":
        return tuple(value or ())
    return value


def field_problem(
    item: Field, value: Any, resolved: Mapping[str, Any], context: Mapping[str, Any] | None = None
) -> str | None:
    """The engine's own check of one setting: its ``[section]`` built from the preset, the ``context`` (other
    form values, ``section.key`` -> value) and this value (``federation.config.SECTIONS``); the message, or
    ``None`` when the engine accepts it. A complaint about another key of the section is not this field's."""
    from federation.config import SECTIONS
    from federation.errors import FederationError

    if item.kind in ("int", "float") and (
        not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value)
    ):
        return f"{item.label}: enter a number."
    values: dict[str, Any] = {}
    for key, raw in dict(resolved.get(item.section) or {}).items():
        other = FIELDS_BY_KEY.get(f"{item.section}.{key}")
        values[key] = _typed(other, raw) if other is not None else raw
    for key, raw in (context or {}).items():
        section, _, name = key.partition(".")
        if section == item.section and key in FIELDS_BY_KEY:
            values[name] = _typed(FIELDS_BY_KEY[key], raw)
    values[item.name] = _typed(item, value)
    try:
        SECTIONS[item.section](**values)
    except FederationError as exc:
        message = str(exc)
        if message.startswith("config ") and not message.startswith(f"config {item.key} "):
            return None
        return _field_message(item, value, message)
    except (TypeError, ValueError) as exc:  # the preset's section itself is incomplete or malformed
        return f"{item.label}: {exc}"
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return list(a or ()) == list(b or ())
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def overrides(values: Mapping[str, Any], resolved: Mapping[str, Any] | None = None) -> list[str]:
    """``section.key=value`` strings for ``gastric-fl train --set``: the method, the rounds, and every other
    setting the method reads whose value differs from the preset's (``resolved``; ``None``: pass them all)."""
    method = str(values.get("strategy.name"))
    result = []
    for item in FIELDS:
        if item.key not in values or not item.applies(values):
            continue
        value = values[item.key]
        always = item.key in ("strategy.name", "run.rounds")
        if resolved is not None and not always and _same(value, baseline(resolved, item.key, method)):
            continue
        result.append(f"{item.key}={toml_value(value, bare_words=True)}")
    return result


def _named_field(message: str, values: Mapping[str, Any]) -> Field | None:
    for item in FIELDS:
        if (f"config {item.key} " in message or f"{item.key} =" in message) and item.applies(values):
            return item
    return None


def _start_problems(config: Any, num_clients: int | None) -> list[tuple[str | None, str]]:
    """What the engine refuses when a run starts, before round 1 (federation/engine/loop.py, the strategies), as
    (the field it is about or ``None``, sentence)."""
    problems: list[tuple[str | None, str]] = []
    name = config.strategy.name
    nhead = config.strategy.nhead if config.strategy.nhead is not None else default_nhead(name)
    units = model_units(config.model.name)
    try:
        check_input_size(config.model.name, config.data.input_size)
    except ModelError as exc:
        problems.append(("data.input_size", f"Input size (px): {exc}."))
    if not 0 <= nhead <= units:
        sentence = f"nhead = {nhead}: {config.model.name} has {units} layer units, so use 0 to {units}."
        problems.append(("strategy.nhead", sentence))
    spec = SPEC[name]  # the method's rules (federation.strategies.registry), as its own build() checks them
    if spec.fixed_nhead is not None and nhead != spec.fixed_nhead:
        sentence = f"{spec.short_name} shares the whole model, so strategy.nhead must be {spec.fixed_nhead}"
        problems.append((None, f"{sentence} (the preset sets {nhead})."))
    if nhead < spec.min_nhead:
        sentence = (
            f"nhead = {nhead}: {spec.short_name} needs a local head, so use {spec.min_nhead} or more (or FedAvg)."
        )
        problems.append(("strategy.nhead", sentence))
    # FedSAF trains a head first only where it splits (its own fedsaf.split, and a head of at least one unit)
    split = spec.head_first and (name != "fedsaf" or (config.fedsaf.split and nhead > 0))
    if split and config.client.head_epochs < 1:
        sentence = f"Head epochs = {config.client.head_epochs}: {SHORT_NAMES[name]} trains the head first (Eq. 24)"
        problems.append(("client.head_epochs", f"{sentence}, so use 1 or more."))
    if num_clients is not None and num_clients < 2 and spec.shares:
        problems.append((None, f"The dataset has {num_clients} hospital(s): a federation needs at least 2."))
    # (the distance itself, amp.dm or fedamp.dm, was checked with its section)
    if (
        name in OWN_START
        and num_clients is not None
        and num_clients >= 2
        and amp_bound_problem(num_clients, config.amp.alpha_k, config.amp.sigma) is not None
    ):
        peers = num_clients - 1
        problems.append(
            (
                "amp.alpha_k",
                f"alpha_k x (hospitals - 1) = {config.amp.alpha_k:g} x {peers} = {config.amp.alpha_k * peers:g} "
                f"exceeds sigma = {config.amp.sigma:g}, so a hospital's weight on its own model could turn "
                f"negative: lower alpha_k to at most {config.amp.sigma / peers:g} or raise sigma.",
            )
        )
    return problems


def check(
    preset: Path | None,
    dataset: Path | None,
    values: Mapping[str, Any],
    num_clients: int | None,
) -> Checked:
    """Every reason these settings cannot run, as ``gastric-fl train`` would refuse them (module docstring).

    Reads the preset and ``dataset``'s files; imports no torch.
    """
    from federation.config import load_config

    resolved, preset_problem = resolve_preset(preset)
    method = str(values.get("strategy.name"))
    found: dict[str, str] = {}
    general: list[str] = [preset_problem] if preset_problem else []
    shown = [item for item in FIELDS if item.key in values and item.applies(values)]
    # Each field beside the other fields not (yet) found invalid: a section's checks stop at their first failure,
    # so a field hidden behind another's failure is found once that one is left out (strategy.wrap needs the
    # method, which is why fields are not checked against the preset alone).
    changed = True
    while changed:
        changed = False
        fine = {item.key: values[item.key] for item in shown if item.key not in found}
        for item in shown:
            if item.key not in found:
                problem = field_problem(item, values[item.key], resolved, fine)
                if problem:
                    found[item.key] = problem
                    changed = True
    # The whole configuration with the valid fields only, so that a rule between settings is found too.
    valid = {k: v for k, v in values.items() if k not in found}
    valid.setdefault("strategy.name", method)
    try:
        config = load_config(preset, overrides(valid, resolved), dataset)
    except ValueError as exc:  # FederationError, ModelError: one line
        message = str(exc)
        named = _named_field(message, values)
        if named is not None and named.key not in found:
            found[named.key] = _field_message(named, values.get(named.key), message)
        elif named is None:
            general.append(message)
    else:
        for key, message in _start_problems(config, num_clients):
            if key is not None and key in FIELDS_BY_KEY and FIELDS_BY_KEY[key].applies(values):
                found.setdefault(key, message)
            else:
                general.append(message)
    ordered = {f.key: found[f.key] for f in FIELDS if f.key in found}
    return Checked(ordered, general)


# --- the command --------------------------------------------------------------------------------------------------


def cli_prefix() -> list[str]:
    """How to call the ``gastric-fl`` CLI from the dashboard: the same interpreter, the same entry point."""
    return [sys.executable, "-m", "app.cli"]


def train_command(preset: Path | None, dataset: Path, run_dir: Path, sets: Sequence[str]) -> list[str]:
    """The ``gastric-fl train`` command for a preset, a dataset, a run folder and ``--set`` overrides."""
    command = [*cli_prefix(), "train"]
    if preset is not None:
        command += ["--config", str(preset)]
    command += ["--data", str(dataset), "--out", str(run_dir)]
    for item in sets:
        command += ["--set", item]
    return command


def as_typed(command: Sequence[str]) -> str:
    """A command as a person types it: ``gastric-fl ...`` instead of the interpreter and module."""
    import shlex

    prefix = cli_prefix()
    if list(command[: len(prefix)]) == prefix:
        return shlex.join(["gastric-fl", *command[len(prefix) :]])
    return shlex.join(command)


def plural(count: int, word: str) -> str:
    """``1 round``, ``4 rounds``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def describe_run(values: Mapping[str, Any], dataset_name: str) -> str:
    """The plain sentence the page shows for a run it starts: "Training FedSAF on demo, 4 rounds"."""
    method = SHORT_NAMES.get(str(values.get("strategy.name")), str(values.get("strategy.name")))
    rounds = values.get("run.rounds")
    count = plural(int(rounds), "round") if isinstance(rounds, int) else "? rounds"
    return f"Training {method} on {dataset_name}, {count}"


DEMO_NAME = "demo"


def demo_commands(root: Path, prefix: list[str] | None = None) -> list[list[str]]:
    """Generate the synthetic demo slides and prepare them into 3 hospitals' tiles (one grayscale hospital).

    Small on purpose (24 slides, 128 px tiles) so the demo is ready in about a minute on a laptop CPU.
    ``prefix`` is how the CLI is called (``cli_prefix()`` to run it, ``["gastric-fl"]`` to show it).
    """
    prefix = cli_prefix() if prefix is None else prefix
    raw = root / "raw" / DEMO_NAME
    prepared = root / "prepared" / DEMO_NAME
    synth = ["synth", "--format", "seed", "--images", "24", "--seed", "0", "--difficulty", "0.3"]
    prepare = ["prepare", "--format", "seed", "--input", str(raw), "--out", str(prepared), "--clients", "3"]
    prepare += ["--tile", "128", "--seed", "0", "--grayscale-clients", "2", "--overwrite"]
    return [[*prefix, *synth, "--out", str(raw), "--overwrite"], [*prefix, *prepare]]


def new_run_id(algorithm: str, existing: set[str], now: float | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<algorithm>``, with ``-2``, ``-3`` ... appended if that folder already exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = f"{stamp}-{algorithm}"
    candidate, n = base, 1
    while candidate in existing:
        n += 1
        candidate = f"{base}-{n}"
    return candidate
