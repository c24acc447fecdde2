"""Run configuration: one frozen dataclass per concern, defaults in TOML, ``--set section.key=value`` overrides.

The sections mirror the FedSAF paper's hyper-parameters (paper 001, Sec. 3-4): ``[strategy] nhead`` is the
number of layer units kept local (Eq. 1), ``[amp]`` holds alpha_k, sigma, lambda and the distance ``dm`` of
Eq. 3-8 and 16-18, ``[fedsaf]`` toggles the Fisher reweighting (Eq. 12-15, 19-20) and the model splitting.
``[depthwise_fim]``, ``[fedlws]`` and ``[fedtlu]`` set the seed methods of papers 000, 002 and 003
(docs/methods.md); ``strategy.wrap`` lists the post-processing steps (FedLWS, FedTLU) applied to a strategy.
``[server]`` holds the server's own safeguards: ``max_weight`` caps any one hospital's FedAvg weight ``n_i / n``.

Loading is strict: an unknown section or key, a value of the wrong type, or a value out of range is rejected
with a ``FederationError`` that names it and says what is allowed. The defaults live in ``DEFAULTS_TOML`` below;
a preset in ``configs/`` only lists what it changes.

Checking a configuration imports no torch: the names it checks against come from the torch-free leaves
`models.names` and `federation.strategies.registry`, so the dashboard's form can check settings at once.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.strategies.registry import EXAMPLE_WEIGHTED, OWN_START, STRATEGY_NAMES, wrap_problem
from infra.toml import toml_value
from models.names import MODEL_NAMES

# The single source of default values. A field missing here has a Python default of None, meaning
# "decided later" (``strategy.nhead``: the chosen strategy's own default; ``client.head_lr``: same as lr).
DEFAULTS_TOML = """
[run]
name = "run"
seed = 0
rounds = 10
device = "cpu"
# "local": hospitals in this process (or run.workers processes); "flower-sim": Flower's simulation runtime;
# "flower": a deployed SuperLink with one SuperNode per hospital ([flower] section, docs/deployment.md).
engine = "local"
workers = 0
threads = 1
keep_checkpoints = 2
# Describe every message that crosses the hospital boundary in <run>/messages.jsonl (names and shapes, no values).
audit = false

[data]
path = "data/prepared/quickstart"
input_size = 64
batch_size = 32
augment = true
eval_batch_size = 128

[model]
name = "mobilenet_v3_small"
weights = ""
in_chans = 3

[strategy]
name = "fedavg"
clients = "all"
# Post-processing steps applied to an averaging strategy's new global model, in order: "fedlws", "fedtlu".
wrap = []
# Where BatchNorm lives, the same for every method: "shared" (statistics and affine parameters travel and are
# mixed like any shared tensor), "local_stats" (running statistics stay at each hospital, as in PFLlib) or
# "local" (statistics and affine parameters stay, as in FedBN). fedbn always keeps them local. The default,
# "local_stats", was chosen by measurement (configs/ablation_fairness.toml, docs/results/README.md): on the
# stain/scanner-shift regime FedAvg's averaged test accuracy rose from 0.73 (shared) to 0.91, FedSAF's was the same.
bn = "local_stats"

[client]
epochs = 1
lr = 0.01
momentum = 0.9
weight_decay = 0.0001
head_epochs = 1
# Recompute BatchNorm statistics over the training tiles after local training (see Recipe.precise_bn).
precise_bn = true
# "sgd" (momentum, weight_decay) or "adam" ([adam]; precision_weighted needs it: paper 004).
optimizer = "sgd"
# Where a hospital starts its round: "centre" (it loads the server's centre p_i / u_i, then is pulled toward it)
# or "own" (it keeps training its own model, pulled toward the centre, as PFLlib and fluke run FedAMP).
# "own" applies to the methods with a personal centre: fedamp, fedsaf.
start = "centre"

[adam]
# Adam's settings when client.optimizer = "adam" (paper 004 uses the Keras defaults: 0.9, 0.999, 1e-7).
beta1 = 0.9
beta2 = 0.999
eps = 1e-7

[precision_weighted]
# Paper 004, Eq. 6: pi_k proportional to (v_hat_k + eps)^-1; inverse = false weights by v_hat_k + eps instead.
eps = 1e-7
inverse = true

[fedprox]
mu = 0.01

[amp]
# Measured in benchmarks/results/amp_distances.md, explained in docs/fedsaf.md: raw distances over 10^5-10^6
# values make every off-diagonal xi vanish, so d_ij is divided by the round's mean distance ("relative").
alpha_k = 0.1
sigma = 1.0
lam = 0.05
dm = "manhattan"
scale = "relative"

[fedsaf]
fim = true
split = true
fisher_batch = 32
# How a hospital estimates tr(FIM) (Eq. 12-15): "per_sample" (mean squared per-sample gradient norm on
# fisher_batch random tiles) or "full_pass" (FedAS: the sum over all training batches of the squared norm of
# the batch-mean gradient). Used by fedsaf, fedas and depthwise_fim.
fisher_estimator = "per_sample"

[fedamp]
# FedAMP's own distance (Huang et al. 2021): squared L2 between the clients' models.
dm = "euclidean"

[depthwise_fim]
# Paper 000's "Reverse" ablation: the input side aggregates every client, the output side only the top ones.
reverse = false

[fedlws]
# Paper 002: 0.1 for CNNs, 0.01 for ResNets, safe range 0.001-0.1; 0.01 is the spec's start for MobileNetV3.
beta = 0.01

[fedtlu]
# Paper 003: the share of each group's blocks updated per round (0.75 / 0.5 / 0.25 in the paper).
portion = 0.5
# "body": the model's main body (MobileNetV3 features.1-11) is one group, ranked by mean tensor score;
# "shapes": the paper's rule, blocks grouped by identical parameter shapes. Other blocks are always updated.
grouping = "body"

[flower]
# SuperLink address HOST:PORT and the federation's CA certificate (engine = "flower"; gastric-fl federation init).
superlink = ""
root_certificates = ""
# How many hospitals must be connected before round 1 (engine = "flower"; flower-sim uses the dataset's).
hospitals = 0
# Seconds the server waits for hospitals to connect, and for each round's replies; a hospital that has not
# answered by then is left out of that round.
connect_timeout = 300
round_timeout = 600

[server]
# The largest aggregation weight any one hospital may get in the example-weighted averages (fedavg, fedprox,
# fedrep, fedbn): the weights n_i / n are capped at max_weight and the excess is spread over the other hospitals
# in proportion to their weights (federation.aggregation.cap_weights). Unset (the default): no cap. A hospital's
# example count is the one it declared in its Hello; the cap bounds what an inflated declaration can buy.
# Must be >= 1/m for m hospitals (weights sum to 1). Example:
# max_weight = 0.5

[privacy]
# Differential privacy at every hospital (federation.privacy, docs/privacy.md): DP-SGD in every training phase,
# a slide as the protected unit, accounted with Opacus's RDP accountant. Off unless noise_multiplier is set; it
# needs model.norm = "group" (BatchNorm mixes the slides of a batch and keeps statistics of private data).
# noise_multiplier = 1.0      # sigma: the noise's standard deviation over the clip norm
# max_grad_norm = 1.0         # C: each slide's gradient is clipped to this L2 norm
# sample_rate = 0.1           # q: each step takes every slide with this probability (Poisson sampling)
# delta = 1e-5                # epsilon is reported at this delta (default 1e-5)
# unit = "slide"              # "slide" (the default) or "tile" (for comparison only: protects a tile, not a patient)
# tiles_per_unit = 8          # at most this many of a sampled slide's tiles (at random) per step (default 8)
"""

DEVICES = ("cpu", "cuda", "auto")
ENGINES = ("local", "flower-sim", "flower")
OPTIMIZERS = ("sgd", "adam")
BN_MODES = ("shared", "local_stats", "local")
STARTS = ("centre", "own")
FISHER_ESTIMATORS = ("per_sample", "full_pass")
NORMS = ("batch", "group")
DP_UNITS = ("slide", "tile")
AMP_METRICS = ("euclidean", "manhattan", "cosine", "cosine_distance")
AMP_SCALES = ("raw", "per_value", "relative")  # federation.aggregation.SCALES
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _fail(where: str, value: object, need: str) -> typing.NoReturn:
    raise FederationError(f"config {where} = {value!r} is out of range: {need}")


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
    """

    name: str
    seed: int
    rounds: int
    device: str
    engine: str
    workers: int
    threads: int
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
        if self.name not in MODEL_NAMES:
            _fail("model.name", self.name, f"use one of {', '.join(MODEL_NAMES)}")
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
class ClientSection:
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
    scale: str = "relative"  # how d_ij is rescaled before A' (federation.aggregation.SCALES; docs/fedsaf.md)

    def __post_init__(self) -> None:
        _positive("amp.alpha_k", self.alpha_k)
        _positive("amp.sigma", self.sigma)
        _at_least("amp.lam", self.lam, 0.0)
        if self.dm not in AMP_METRICS:
            _fail("amp.dm", self.dm, f"use one of {', '.join(AMP_METRICS)}")
        if self.scale not in AMP_SCALES:
            _fail("amp.scale", self.scale, f"use one of {', '.join(AMP_SCALES)}")


def amp_bound_problem(num_clients: int, alpha_k: float, sigma: float) -> str | None:
    """Why AMP with ``alpha_k`` and ``sigma`` could give one of ``num_clients`` hospitals a negative self-weight
    (Eq. 16), or ``None`` when it cannot.

    For a distance ``d >= 0``, ``A'(d) = exp(-d/sigma)/sigma <= 1/sigma``, so ``xi_ii >= 1 - alpha_k (m - 1) /
    sigma``: non-negative exactly when ``alpha_k (m - 1) <= sigma`` (DESIGN.md). The boundary itself is allowed
    (a relative tolerance of 1e-12). The one rule: `federation.aggregation.check_amp_settings`, which the engine
    applies when a run starts, calls this; it needs no torch, so the dashboard checks settings before a run.
    """
    peers = num_clients - 1
    if peers < 1 or alpha_k * peers <= sigma * (1.0 + 1e-12):
        return None
    return (
        f"amp.alpha_k={alpha_k} with amp.sigma={sigma} and {num_clients} clients could make a client's "
        f"self-weight xi_ii negative (needs alpha_k * (m-1) <= sigma): set amp.alpha_k <= {sigma / peers:.6g} "
        "or raise amp.sigma"
    )


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


TLU_GROUPINGS = ("body", "shapes")


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


def max_weight_problem(num_clients: int, max_weight: float) -> str | None:
    """Why ``server.max_weight`` cannot cap the weights of ``num_clients`` hospitals, or ``None`` when it can.

    The weights sum to 1, so some hospital has at least ``1/m``: a cap below ``1/m`` cannot hold (a relative
    tolerance of 1e-12 lets ``1/m`` itself through); ``num_clients = 0`` (not known yet) checks only ``(0, 1]``.
    The one rule: the configuration applies it when ``strategy.clients`` lists the hospitals, the averaging
    strategies when a run starts (``federation.strategies.fedavg.Averaging``), and
    `federation.aggregation.cap_weights` on every call; it needs no torch.
    """
    if not (math.isfinite(max_weight) and 0.0 < max_weight <= 1.0):
        return f"config server.max_weight = {max_weight!r} is out of range: use a share in (0, 1], e.g. 0.5"
    if num_clients < 1 or max_weight * num_clients >= 1.0 - 1e-12:
        return None
    least = math.ceil(1e6 / num_clients) / 1e6  # 1/m rounded up, so that the suggested value is accepted
    return (
        f"config server.max_weight = {max_weight!r} is out of range: with {num_clients} "
        f"{'hospital' if num_clients == 1 else 'hospitals'} the weights sum to 1, so a cap below 1/{num_clients} "
        f"cannot hold: use server.max_weight >= {least:g} (or leave it unset: no cap)"
    )


@dataclass(frozen=True)
class ServerSection:
    """``[server]``: the server's own safeguards. ``max_weight``: the largest aggregation weight one hospital may get
    in the example-weighted averages (``n_i / n``, FedAvg family; `federation.aggregation.cap_weights`); ``None``
    (the default) caps nothing."""

    max_weight: float | None = None

    def __post_init__(self) -> None:
        if self.max_weight is not None:
            problem = max_weight_problem(0, self.max_weight)  # against 1/m once the hospitals are known
            if problem is not None:
                raise FederationError(problem)


@dataclass(frozen=True)
class PrivacySection:
    """``[privacy]``: DP-SGD at every hospital (`federation.privacy`). Off while ``noise_multiplier`` is ``None``;
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


@dataclass(frozen=True)
class RunConfig:
    """The whole configuration of one run; ``config_to_toml`` writes it back exactly."""

    run: RunSection
    data: DataSection
    model: ModelSection
    strategy: StrategySection
    client: ClientSection
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

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (tuples as lists, ``None`` fields left out: TOML has no null)."""
        out: dict[str, dict[str, Any]] = {}
        for section in dataclasses.fields(self):
            values = dataclasses.asdict(getattr(self, section.name))
            out[section.name] = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}
        return out


SECTIONS: dict[str, type] = {f.name: typing.get_type_hints(RunConfig)[f.name] for f in dataclasses.fields(RunConfig)}


def _coerce(where: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field's annotation (int, float, bool, str, ``X | None``, tuples of int or str).

    A tuple of str also accepts one string, split at commas (``--set strategy.wrap=fedlws,fedtlu``).
    """
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    for option in options:
        if option is type(None):
            continue
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if option is str and isinstance(value, str):
            return value
        if (
            typing.get_origin(option) is tuple
            and typing.get_args(option)[0] is int
            and isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            return tuple(value)
        if typing.get_origin(option) is tuple and typing.get_args(option)[0] is str:
            items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
            if isinstance(items, list) and all(isinstance(v, str) for v in items):
                return tuple(items)
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options if o is not type(None))
    raise FederationError(f"config {where} = {value!r} has the wrong type: expected {names}")


def _check_known(raw: Mapping[str, Any], source: str) -> None:
    for section, values in raw.items():
        if section not in SECTIONS:
            raise FederationError(f"{source}: unknown section [{section}]; known sections: {', '.join(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise FederationError(f"{source}: [{section}] must be a table of key = value pairs")
        known = [f.name for f in dataclasses.fields(SECTIONS[section])]
        for key in values:
            if key not in known:
                raise FederationError(f"{source}: unknown key {section}.{key}; [{section}] accepts {', '.join(known)}")


def _merge(base: dict[str, dict[str, Any]], extra: Mapping[str, Any]) -> None:
    for section, values in extra.items():
        base.setdefault(section, {}).update(values)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split ``section.key=value``; the value is read as TOML (``0.1``, ``true``, ``[0, 1]``), else as a string."""
    target, sep, raw = text.partition("=")
    section, dot, key = target.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise FederationError(f"--set {text!r}: write it as section.key=value, e.g. --set run.rounds=3")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as fedavg or cpu
    return section, key.strip(), value


def config_from_dict(raw: Mapping[str, Any], source: str = "config") -> RunConfig:
    """Build a ``RunConfig`` from the defaults updated by ``raw`` (nested ``{section: {key: value}}``)."""
    _check_known(raw, source)
    merged: dict[str, dict[str, Any]] = {}
    _merge(merged, tomllib.loads(DEFAULTS_TOML))
    _merge(merged, raw)
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        values = {key: _coerce(f"{name}.{key}", value, hints[key]) for key, value in merged.get(name, {}).items()}
        try:
            sections[name] = cls(**values)
        except TypeError as exc:
            raise FederationError(f"{source}: [{name}] is incomplete ({exc})") from exc
    config = RunConfig(**sections)
    if config.client.epochs + config.client.head_epochs == 0:
        _fail("client.epochs", 0, "train for at least one epoch (client.epochs or client.head_epochs > 0)")
    _check_unused(config, "adam", config.client.optimizer == "adam", 'they apply only with client.optimizer = "adam"')
    if config.strategy.name == "precision_weighted" and config.client.optimizer != "adam":
        _fail(
            "client.optimizer",
            config.client.optimizer,
            "precision_weighted weights clients by Adam's second moments: set client.optimizer = adam "
            "(paper 004 uses lr 0.001)",
        )
    if config.client.start == "own" and config.strategy.name not in OWN_START:
        _fail(
            "client.start",
            "own",
            f"only {', '.join(sorted(OWN_START))} give each hospital a centre to be pulled toward; "
            f"with {config.strategy.name} a hospital would train alone: use client.start = centre",
        )
    _check_unused(
        config,
        "precision_weighted",
        config.strategy.name == "precision_weighted",
        "they apply only with strategy.name = precision_weighted",
    )
    _check_max_weight(config)
    if config.privacy.enabled and config.model.norm != "group":
        _fail(
            "model.norm",
            config.model.norm or "batch",
            "differential privacy needs a normalisation without batch statistics: set model.norm = group",
        )
    return config


def _check_max_weight(config: RunConfig) -> None:
    """Refuse ``server.max_weight`` for a strategy whose weights are not example counts (it would cap nothing and
    mislead), and a cap below ``1/m`` when ``strategy.clients`` names the ``m`` hospitals (else: at run start)."""
    cap = config.server.max_weight
    if cap is None:
        return
    if config.strategy.name not in EXAMPLE_WEIGHTED:
        name = config.strategy.name
        capped = ", ".join(n for n in STRATEGY_NAMES if n in EXAMPLE_WEIGHTED)
        raise FederationError(
            f"config server.max_weight = {cap!r} does not apply to strategy {name}: it caps the example-count "
            f"weights n_i / n of {capped}, and {name} does not weight hospitals by their example counts: "
            "leave server.max_weight unset"
        )
    if not isinstance(config.strategy.clients, str):
        problem = max_weight_problem(len(config.strategy.clients), cap)
        if problem is not None:
            raise FederationError(problem)


def _check_unused(config: RunConfig, section: str, applies: bool, why: str) -> None:
    """Refuse a setting changed from its default in a section the run does not use (it would silently do nothing)."""
    if applies:
        return
    defaults = tomllib.loads(DEFAULTS_TOML).get(section, {})
    values = dataclasses.asdict(getattr(config, section))
    for key, default in defaults.items():
        if values[key] != default:
            _fail(f"{section}.{key}", values[key], f"leave [{section}] at its defaults: {why}")


def read_toml(file: Path, hint: str) -> dict[str, Any]:
    """Parse the TOML file ``file``; a missing or malformed file is a one-line ``FederationError`` (``hint``: what
    to pass instead)."""
    if not file.is_file():
        raise FederationError(f"config file {file} does not exist: {hint}")
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FederationError(f"config file {file} is not valid TOML: {exc}") from exc


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), data: str | Path | None = None
) -> RunConfig:
    """Defaults, then the TOML file at ``path``, then each ``--set`` override, then ``--data``."""
    raw: dict[str, dict[str, Any]] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        loaded = read_toml(Path(path), "pass a TOML preset such as configs/demo.toml")
        _check_known(loaded, source)
        _merge(raw, loaded)
    for text in overrides:
        section, key, value = parse_override(text)
        _check_known({section: {key: value}}, f"--set {text}")
        _merge(raw, {section: {key: value}})
    if data is not None:
        _merge(raw, {"data": {"path": str(data)}})
    return config_from_dict(raw, source)


def with_values(config: RunConfig, section: str, **values: Any) -> RunConfig:
    """A copy of ``config`` with ``values`` replaced in ``section`` (validated again)."""
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **values)})


def config_to_toml(config: RunConfig) -> str:
    """The configuration as TOML text that ``load_config`` reads back to an equal ``RunConfig``."""
    lines: list[str] = []
    for section, values in config.to_dict().items():
        if not values:  # [server] with nothing set: left out, so a run without it writes what it always wrote
            continue
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)
