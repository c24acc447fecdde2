"""The sections of a run configuration: one frozen dataclass per concern, each checking its own values.

Every ``__post_init__`` rejects a value out of range with a ``FederationError`` that names the key (``section.key``,
also its ``.key``) and says what is allowed (``_fail``, ``_at_least``, ``_positive``). ``RunConfig`` holds one of each;
``SECTIONS`` maps a section's name to its class. The sections written out here are followed by those the methods
declare in their specs (``DECLARED``: one class built from each spec's `federation.methods.Setting` list, checking
the declared ranges the same way). The rules that need the number of hospitals (AMP's self-weight bound,
``server.max_weight`` against ``1/m``) are `federation.bounds`'s. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from typing import Any

from federation.bounds import max_weight_problem, norm_factor_problem
from federation.config.defaults import (
    AMP_METRICS,
    AMP_SCALES,
    BN_MODES,
    DEVICES,
    DP_UNITS,
    ENGINES,
    FISHER_ESTIMATORS,
    NORMS,
    OPTIMIZERS,
    PRECISIONS,
    ROBUST_METHODS,
    STARTS,
    TLU_GROUPINGS,
)
from federation.errors import FederationError
from federation.methods import SPECS, STRATEGY_NAMES, StrategySpec, wrap_problem
from models.errors import ModelError
from models.names import MODEL_NAMES, TIMM_PREFIX, check_model_name

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _fail(where: str, value: object, need: str) -> typing.NoReturn:
    raise FederationError(f"config {where} = {value!r} is out of range: {need}", key=where)


def _at_least(where: str, value: float, lo: float) -> None:
    if not value >= lo:
        _fail(where, value, f"use a value >= {lo}")


def _positive(where: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        _fail(where, value, "use a finite value > 0")


@dataclass(frozen=True)
class RunSection:
    """``[run]``: identity and length of the run, and where it executes.

    ``workers``: 0 runs the clients one after another in this process, W spreads them over W processes.
    ``threads``: torch threads per process (0 keeps torch's default, all cores); the default 1 was the fastest
    on a shared 2-core machine (``benchmarks/results/round_time.md``).
    ``precision``: ``fp32``, or ``bf16`` (autocast of the forward pass and loss, on a GPU that supports it; the CPU
    path runs fp32 either way unless asked). ``deterministic``: deterministic GPU kernels
    (`federation.hospital.gpu.deterministic`), so that a seed gives the same figures run to run on one GPU.
    ``check_gpu_memory``: refuse, before they start, ``run.workers`` processes (or ``ablate --workers`` cells) that
    share one GPU when `federation.hospital.gpu_memory` estimates they will not fit its free memory; ``false`` skips the
    estimate (it errs high: about twice what five bf16 workers held on an H200).
    """

    name: str
    seed: int
    rounds: int
    device: str
    engine: str
    workers: int
    threads: int
    precision: str
    deterministic: bool
    check_gpu_memory: bool
    keep_checkpoints: int
    audit: bool

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            _fail("run.engine", self.engine, f"use one of {', '.join(ENGINES)}")
        if not _NAME_RE.match(self.name):
            _fail("run.name", self.name, "letters, digits, '_', '-', '.' only (it prefixes the run folder name)")
        _at_least("run.seed", self.seed, 0)
        _at_least("run.rounds", self.rounds, 1)
        if self.device not in DEVICES:
            _fail("run.device", self.device, f"use one of {', '.join(DEVICES)}")
        _at_least("run.workers", self.workers, 0)
        _at_least("run.threads", self.threads, 0)
        if self.precision not in PRECISIONS:
            _fail("run.precision", self.precision, f"use one of {', '.join(PRECISIONS)}")
        _at_least("run.keep_checkpoints", self.keep_checkpoints, 1)


@dataclass(frozen=True)
class DataSection:
    """``[data]``: the prepared dataset and how tiles reach the model."""

    path: str
    input_size: int
    batch_size: int
    augment: bool
    eval_batch_size: int

    def __post_init__(self) -> None:
        if not self.path:
            _fail("data.path", self.path, "name a prepared dataset folder (gastric-fl prepare output)")
        _at_least("data.input_size", self.input_size, 16)
        _at_least("data.batch_size", self.batch_size, 2)  # BatchNorm needs two samples per training batch
        _at_least("data.eval_batch_size", self.eval_batch_size, 1)


@dataclass(frozen=True)
class ModelSection:
    """``[model]``: the architecture (paper Table 3), an optional local weights file and the input channels."""

    name: str
    weights: str
    in_chans: int
    # "batch" (None, the default: the architecture's BatchNorm) or "group" (GroupNorm, no batch statistics: for
    # differential privacy, models.registry.GROUPNORM_GROUPS); None is not written to config.toml.
    norm: str | None = None

    def __post_init__(self) -> None:
        try:
            check_model_name(self.name)  # one of the four, or timm/<timm model name> (models.names)
        except ModelError as exc:
            need = f"use one of {', '.join(MODEL_NAMES)} or {TIMM_PREFIX}<timm model name>"
            _fail("model.name", self.name, need if not self.name.startswith(TIMM_PREFIX) else str(exc))
        if self.norm not in (None, *NORMS):
            _fail("model.norm", self.norm, f"use one of {', '.join(NORMS)}")
        if self.in_chans not in (1, 3):
            _fail("model.in_chans", self.in_chans, "use 3 (gray tiles replicated) or 1 (every tile made gray)")


@dataclass(frozen=True)
class StrategySection:
    """``[strategy]``: the federated algorithm, how many layer units stay local, which clients take part."""

    name: str
    clients: str | tuple[int, ...]
    wrap: tuple[str, ...]
    bn: str
    nhead: int | None = None

    def __post_init__(self) -> None:
        if self.bn not in BN_MODES:
            _fail("strategy.bn", self.bn, f"use one of {', '.join(BN_MODES)}")
        if self.name not in STRATEGY_NAMES:
            _fail("strategy.name", self.name, f"use one of {', '.join(STRATEGY_NAMES)}")
        problem = wrap_problem(self.name, self.wrap)
        if problem is not None:
            _fail("strategy.wrap", list(self.wrap), problem)
        if self.nhead is not None:
            _at_least("strategy.nhead", self.nhead, 0)
        if isinstance(self.clients, str):
            if self.clients != "all":
                _fail("strategy.clients", self.clients, 'use "all" or a list of client indices such as [0, 2]')
        else:
            if not self.clients or len(set(self.clients)) != len(self.clients) or min(self.clients) < 0:
                _fail("strategy.clients", list(self.clients), "use distinct client indices >= 0, at least one")


@dataclass(frozen=True)
class HospitalSection:
    """``[client]``: local training (SGD) per round; ``head_*`` applies to strategies with a personal head."""

    epochs: int
    lr: float
    momentum: float
    weight_decay: float
    head_epochs: int
    precise_bn: bool
    optimizer: str
    start: str
    head_lr: float | None = None

    def __post_init__(self) -> None:
        if self.start not in STARTS:
            _fail("client.start", self.start, f"use one of {', '.join(STARTS)}")
        if self.optimizer not in OPTIMIZERS:
            _fail("client.optimizer", self.optimizer, f"use one of {', '.join(OPTIMIZERS)}")
        _at_least("client.epochs", self.epochs, 0)
        _positive("client.lr", self.lr)
        if not 0.0 <= self.momentum < 1.0:
            _fail("client.momentum", self.momentum, "use 0 <= momentum < 1")
        _at_least("client.weight_decay", self.weight_decay, 0.0)
        _at_least("client.head_epochs", self.head_epochs, 0)
        if self.head_lr is not None:
            _positive("client.head_lr", self.head_lr)


@dataclass(frozen=True)
class AdamSection:
    """``[adam]``: Adam's moment decay rates and epsilon, used when ``client.optimizer = "adam"``."""

    beta1: float
    beta2: float
    eps: float

    def __post_init__(self) -> None:
        for key, value in (("adam.beta1", self.beta1), ("adam.beta2", self.beta2)):
            if not 0.0 <= value < 1.0:
                _fail(key, value, "use 0 <= beta < 1")
        _positive("adam.eps", self.eps)


@dataclass(frozen=True)
class PrecisionWeightedSection:
    """``[precision_weighted]``: paper 004's aggregation (Eq. 6): its epsilon and which reading of the weights."""

    eps: float
    inverse: bool

    def __post_init__(self) -> None:
        _positive("precision_weighted.eps", self.eps)


@dataclass(frozen=True)
class FedProxSection:
    """``[fedprox]``: the proximal strength mu of FedProx."""

    mu: float

    def __post_init__(self) -> None:
        _at_least("fedprox.mu", self.mu, 0.0)


@dataclass(frozen=True)
class AmpSection:
    """``[amp]``: Attentive Message Passing (paper Eq. 3-8, 16-18) and its proximal weight lambda (Eq. 23-25)."""

    alpha_k: float
    sigma: float
    lam: float
    dm: str
    scale: str = "relative"  # how d_ij is rescaled before A' (federation.strategies.amp.SCALES; docs/fedsaf.md)

    def __post_init__(self) -> None:
        _positive("amp.alpha_k", self.alpha_k)
        _positive("amp.sigma", self.sigma)
        _at_least("amp.lam", self.lam, 0.0)
        if self.dm not in AMP_METRICS:
            _fail("amp.dm", self.dm, f"use one of {', '.join(AMP_METRICS)}")
        if self.scale not in AMP_SCALES:
            _fail("amp.scale", self.scale, f"use one of {', '.join(AMP_SCALES)}")


@dataclass(frozen=True)
class FedSAFSection:
    """``[fedsaf]``: the ablation toggles (FIM on/off, model splitting on/off) and the Fisher mini-batch size."""

    fim: bool
    split: bool
    fisher_batch: int
    fisher_estimator: str

    def __post_init__(self) -> None:
        _at_least("fedsaf.fisher_batch", self.fisher_batch, 1)
        if self.fisher_estimator not in FISHER_ESTIMATORS:
            _fail("fedsaf.fisher_estimator", self.fisher_estimator, f"use one of {', '.join(FISHER_ESTIMATORS)}")


@dataclass(frozen=True)
class FedAMPSection:
    """``[fedamp]``: the FedAMP baseline's own distance (squared L2 in Huang et al. 2021)."""

    dm: str

    def __post_init__(self) -> None:
        if self.dm not in AMP_METRICS:
            _fail("fedamp.dm", self.dm, f"use one of {', '.join(AMP_METRICS)}")


@dataclass(frozen=True)
class DepthwiseFIMSection:
    """``[depthwise_fim]``: depth-wise Fisher aggregation (paper 000); ``reverse`` is its "Reverse" ablation."""

    reverse: bool


@dataclass(frozen=True)
class FedLWSSection:
    """``[fedlws]``: layer-wise weight shrinking (paper 002, Eq. 7-8); ``beta`` scales the shrinking."""

    beta: float

    def __post_init__(self) -> None:
        _positive("fedlws.beta", self.beta)


@dataclass(frozen=True)
class FedTLUSection:
    """``[fedtlu]``: targeted layer updates (paper 003): the portion of each group updated, and the grouping."""

    portion: float
    grouping: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.portion) and 0.0 < self.portion <= 1.0):
            _fail("fedtlu.portion", self.portion, "use a share of blocks in (0, 1], e.g. 0.5")
        if self.grouping not in TLU_GROUPINGS:
            _fail("fedtlu.grouping", self.grouping, f"use one of {', '.join(TLU_GROUPINGS)}")


@dataclass(frozen=True)
class FlowerSection:
    """``[flower]``: how the server reaches deployed hospitals (``run.engine = "flower"``) and how long it waits."""

    superlink: str
    root_certificates: str
    hospitals: int
    connect_timeout: float
    round_timeout: float

    def __post_init__(self) -> None:
        if self.superlink and not re.match(r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$", self.superlink):
            _fail("flower.superlink", self.superlink, "write it as HOST:PORT, e.g. 127.0.0.1:9093")
        _at_least("flower.hospitals", self.hospitals, 0)
        _positive("flower.connect_timeout", self.connect_timeout)
        _positive("flower.round_timeout", self.round_timeout)


# A declared tile count above this is not a count (2^53: the last integer every float holds exactly).
MAX_COUNT = 2**53
# server.trim and server.norm_factor when robust is set and they are not (None keeps config.toml as it was)
DEFAULT_TRIM = 1
DEFAULT_NORM_FACTOR = 1.0


@dataclass(frozen=True)
class ServerSection:
    """``[server]``: the server's own safeguards, every one off (``None``) by default.

    ``max_weight``: the largest weight one hospital may get in any aggregate, for every method that shares
    (`federation.strategies.aggregation.cap_weights`). ``robust``: ``"norm_bound"`` (updates clipped to
    ``norm_factor`` times the round's median update norm; `federation.strategies.robust.bound_update_norms`) or
    ``"trimmed_mean"`` (the coordinate-wise mean after dropping the ``trim`` largest and smallest values;
    `federation.strategies.robust.trimmed_mean`), for the averaging methods. ``max_examples``: the most tiles a
    hospital may declare in its Hello (always at most 2^53).
    """

    max_weight: float | None = None
    robust: str | None = None
    norm_factor: float | None = None
    trim: int | None = None
    max_examples: int | None = None

    def __post_init__(self) -> None:
        if self.max_weight is not None:
            problem = max_weight_problem(0, self.max_weight)  # against 1/m once the hospitals are known
            if problem is not None:
                raise FederationError(problem, key="server.max_weight")
        if self.robust is not None and self.robust not in ROBUST_METHODS:
            _fail("server.robust", self.robust, f"use one of {', '.join(ROBUST_METHODS)}, or leave it unset")
        if self.norm_factor is not None:
            problem = norm_factor_problem(self.norm_factor)
            if problem is not None:
                raise FederationError(problem, key="server.norm_factor")
            if self.robust != "norm_bound":
                _fail("server.norm_factor", self.norm_factor, 'it applies only with server.robust = "norm_bound"')
        if self.trim is not None:
            _at_least("server.trim", self.trim, 1)
            if self.robust != "trimmed_mean":
                _fail("server.trim", self.trim, 'it applies only with server.robust = "trimmed_mean"')
        if self.max_examples is not None and not 1 <= self.max_examples <= MAX_COUNT:
            _fail("server.max_examples", self.max_examples, f"use a whole number of tiles in [1, {MAX_COUNT}]")

    @property
    def count_limit(self) -> int:
        """The most tiles a Hello may declare: ``max_examples``, else 2^53."""
        return MAX_COUNT if self.max_examples is None else self.max_examples

    @property
    def trim_count(self) -> int:
        """``trim`` as used: 1 unless set."""
        return DEFAULT_TRIM if self.trim is None else self.trim

    @property
    def bound_factor(self) -> float:
        """``norm_factor`` as used: 1 unless set."""
        return DEFAULT_NORM_FACTOR if self.norm_factor is None else self.norm_factor


@dataclass(frozen=True)
class PrivacySection:
    """``[privacy]``: DP-SGD at every hospital (`federation.hospital.privacy`). Off while ``noise_multiplier`` is
    ``None``;
    unset fields are not written to config.toml, so a run without DP writes what it always wrote."""

    noise_multiplier: float | None = None
    max_grad_norm: float | None = None
    sample_rate: float | None = None
    delta: float | None = None
    unit: str | None = None
    tiles_per_unit: int | None = None

    @property
    def enabled(self) -> bool:
        """Whether the run trains with DP-SGD."""
        return self.noise_multiplier is not None

    @property
    def run_delta(self) -> float:
        """The delta epsilon is reported at (1e-5 unless set)."""
        return 1e-5 if self.delta is None else self.delta

    def __post_init__(self) -> None:
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if not self.enabled:
            if given:
                key, value = next(iter(given.items()))
                _fail(f"privacy.{key}", value, "set privacy.noise_multiplier to turn DP on, or leave [privacy] empty")
            return
        for key in ("max_grad_norm", "sample_rate"):
            if getattr(self, key) is None:
                _fail(f"privacy.{key}", None, "set it: DP-SGD needs a clip norm and a sampling rate (docs/privacy.md)")
        assert self.noise_multiplier is not None
        assert self.max_grad_norm is not None
        assert self.sample_rate is not None
        _positive("privacy.noise_multiplier", self.noise_multiplier)
        _positive("privacy.max_grad_norm", self.max_grad_norm)
        if not 0.0 < self.sample_rate <= 1.0:
            _fail("privacy.sample_rate", self.sample_rate, "use a probability in (0, 1]")
        if not 0.0 < self.run_delta < 1.0:
            _fail("privacy.delta", self.delta, "use a probability in (0, 1), far below 1 / (slides per hospital)")
        if self.unit not in (None, *DP_UNITS):
            _fail("privacy.unit", self.unit, f"use one of {', '.join(DP_UNITS)}")
        if self.tiles_per_unit is not None and self.tiles_per_unit < 1:
            _fail("privacy.tiles_per_unit", self.tiles_per_unit, "use a whole number >= 1")


def _declared_section(spec: StrategySpec) -> type:
    """The frozen dataclass of the section ``[<method>]`` that ``spec`` declares (``StrategySpec.section``): one
    field per `federation.methods.Setting`, of its type and with its default, and a ``__post_init__`` that refuses
    a value outside the declared range with the key it is about (``_fail``), as the written sections do."""

    def check(self: Any) -> None:
        for setting in spec.section:
            value = getattr(self, setting.name)
            need = setting.problem(value)
            if need is not None:
                _fail(f"{spec.name}.{setting.name}", value, need)

    name = "".join(part.title() for part in spec.name.split("_")) + "Section"
    doc = f"``[{spec.name}]``: {spec.short_name}'s own settings, as its spec declares them (`federation.methods`)."
    fields = [(s.name, s.kind, dataclasses.field(default=s.default)) for s in spec.section]
    cls = dataclasses.make_dataclass(name, fields, namespace={"__post_init__": check, "__doc__": doc}, frozen=True)
    cls.__module__ = __name__
    return cls


# The sections the methods declare, by method name in the registry's order; each class is also a name of this module,
# where pickle finds it (a configuration travels to ablation cells' worker processes).
DECLARED: dict[str, type] = {spec.name: _declared_section(spec) for spec in SPECS if spec.section}


def _declared_defaults() -> dict[str, Any]:
    return {name: cls() for name, cls in DECLARED.items()}


@dataclass(frozen=True)
class RunConfig:
    """The whole configuration of one run; ``config_to_toml`` writes it back exactly.

    ``declared`` holds the sections the methods declare (``DECLARED``, by name; written after the others);
    ``section(name)`` reads a section of either kind (``config.section("fedprox")`` is ``config.fedprox``).
    """

    run: RunSection
    data: DataSection
    model: ModelSection
    strategy: StrategySection
    client: HospitalSection
    fedprox: FedProxSection
    amp: AmpSection
    fedsaf: FedSAFSection
    depthwise_fim: DepthwiseFIMSection
    fedlws: FedLWSSection
    fedtlu: FedTLUSection
    flower: FlowerSection
    adam: AdamSection
    precision_weighted: PrecisionWeightedSection
    fedamp: FedAMPSection
    server: ServerSection
    privacy: PrivacySection
    declared: dict[str, Any] = dataclasses.field(default_factory=_declared_defaults, hash=False)

    def __post_init__(self) -> None:
        if set(self.declared) != set(DECLARED):
            raise ValueError(f"declared sections {sorted(self.declared)}: expected {sorted(DECLARED)}")

    def section(self, name: str) -> Any:
        """The section ``[name]``: one of the fields above, or one a method declares (``section("fedtoy").beta``)."""
        if name in self.declared:
            return self.declared[name]
        if name not in SECTIONS:
            raise KeyError(f"no section [{name}]: the sections are {', '.join(SECTIONS)}")
        return getattr(self, name)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (tuples as lists, ``None`` fields left out: TOML has no null)."""
        out: dict[str, dict[str, Any]] = {}
        for name in SECTIONS:
            values = dataclasses.asdict(self.section(name))
            out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}
        return out


def _sections() -> dict[str, type]:
    """Every section's class by name: ``RunConfig``'s fields in order, then the declared ones; a declared section
    may not reuse a written section's name, nor its class a name of this module."""
    hints = typing.get_type_hints(RunConfig)
    written = {f.name: hints[f.name] for f in dataclasses.fields(RunConfig) if f.name != "declared"}
    for name, cls in DECLARED.items():
        if name in written or name == "declared" or cls.__name__ in globals():
            raise ValueError(f"strategy {name} declares a section [{name}] ({cls.__name__}) the configuration has")
        globals()[cls.__name__] = cls
    return {**written, **DECLARED}


SECTIONS: dict[str, type] = _sections()
