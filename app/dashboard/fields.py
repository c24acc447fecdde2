"""The Federation form's fields: which ``gastric-fl train`` settings the form offers (``section.key`` of
``federation.config``), how they are grouped, which methods read each, and the number inputs' limits.

The methods' names and what each reads come from the strategy registry (``federation.methods``), the
models' layer units from ``models.names``: nothing here imports torch. The settings a method declares in its spec
(`federation.methods.Setting`) become fields here with no line of their own (``declared_field``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from federation.config import (
    AMP_METRICS,
    AMP_SCALES,
    BN_MODES,
    FISHER_ESTIMATORS,
    OPTIMIZERS,
    STARTS,
    TLU_GROUPINGS,
)
from federation.methods import (
    AVERAGING,
    FORCED_BN,
    OWN_START,
    SPEC,
    SPECS,
    WRAPPER_NAMES,
    Setting,
    StrategySpec,
    readers,
)
from models.names import DEFAULT_MODEL, LAYER_UNITS, is_timm_name

DEFAULT_UNITS = LAYER_UNITS[DEFAULT_MODEL]

# The methods offered, FedSAF first (the registry's menu order); the short name is used in sentences, the long
# one in the picker. Which settings a method reads comes from its spec (federation.methods).
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
    the setting (``None``: every method, or only the methods whose spec owns it, `StrategySpec.owned`: among its
    ``settings`` or in its declared section, `federation.methods.readers`); ``when``: a further condition on the other
    values (e.g. Adam's settings only with ``client.optimizer = adam``). A field that does not apply is neither shown
    nor passed to the engine.
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
        """The ``[section]`` of ``federation.config`` it belongs to."""
        return self.key.partition(".")[0]

    @property
    def name(self) -> str:
        """Its key within the section."""
        return self.key.partition(".")[2]

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the chosen method (``values["strategy.name"]``) reads this setting, given the other values."""
        method = str(values.get("strategy.name", ""))
        methods = self.methods if self.methods is not None else (readers(self.key) or None)
        if methods is not None and method not in methods:
            return False
        return self.when is None or bool(self.when(values))


def _wraps(step: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda values: step in (values.get("strategy.wrap") or ())


_LISTED: tuple[Field, ...] = (
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
    ),
    Field(
        "fedamp.dm",
        "Distance dm",
        "choice",
        "method",
        "FedAMP's own distance (squared L2 in Huang et al. 2021).",
        options=AMP_METRICS,
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
    Field("fedsaf.fim", "Fisher reweighting (FIM)", "bool", "method", "Paper Eq. 19-20."),
    Field(
        "fedsaf.split",
        "Model splitting",
        "bool",
        "method",
        "Off: nhead = 0, everything is shared.",
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
    ),
    Field(
        "depthwise_fim.reverse",
        "Reverse",
        "bool",
        "method",
        "Paper 000's ablation: the input side aggregates every hospital, the output side only the top ones.",
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
    ),
    Field(
        "precision_weighted.inverse",
        "Inverse weighting",
        "bool",
        "method",
        "Weights proportional to 1 / (v + eps), as the paper reads; off weights by v + eps.",
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

_KINDS = {bool: "bool", int: "int", float: "float", str: "choice"}


def declared_field(spec: StrategySpec, setting: Setting) -> Field:
    """The field of a setting ``spec`` declares for its own section (`federation.methods.Setting`): among the
    method's hyper-parameters, shown for that method alone (``readers``), with the declared label, help, limits
    (an excluded bound is the engine check's to refuse) and choices."""
    kind = _KINDS[setting.kind]
    return Field(
        f"{spec.name}.{setting.name}",
        setting.label or setting.name,
        kind,
        "method",
        setting.help,
        setting.minimum,
        setting.maximum,
        setting.step,
        "%g" if kind == "float" else None,
        options=setting.choices,
    )


# Every field in the order of GROUPS (each group's fields as listed above; the declared ones last in the method's
# group, their methods in the picker's order).
_DECLARED = tuple(declared_field(SPEC[name], setting) for name in ALGORITHMS for setting in SPEC[name].section)
FIELDS: tuple[Field, ...] = tuple(sorted((*_LISTED, *_DECLARED), key=lambda item: list(GROUPS).index(item.group)))
FIELDS_BY_KEY: dict[str, Field] = {f.key: f for f in FIELDS}


@cache
def model_units(model_name: str) -> int:
    """How many layer units the model has, the upper bound of ``nhead``: ``models.names.LAYER_UNITS`` for the four
    torchvision networks; a timm architecture (``timm/<name>``) is counted by `models.registry.layer_unit_count`
    (torch is imported then, and only then); the default model's count for a name that is not a model (the
    configuration check names that problem)."""
    if model_name in LAYER_UNITS:
        return LAYER_UNITS[model_name]
    if is_timm_name(model_name):
        from models.errors import ModelError
        from models.registry import layer_unit_count

        try:
            return layer_unit_count(model_name)
        except (ModelError, RuntimeError):  # a name timm lacks: the configuration check says so
            return DEFAULT_UNITS
    return DEFAULT_UNITS


def limits(item: Field, units: int) -> tuple[float | None, float | None]:
    """The number input's minimum and maximum (``strategy.nhead`` goes up to the model's layer units)."""
    if item.key == "strategy.nhead":
        return 0, units
    return item.minimum, item.maximum
