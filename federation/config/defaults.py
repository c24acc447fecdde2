"""The run configuration's default values (``DEFAULTS_TOML``) and the choices its enumerated fields accept.

``DEFAULTS_TOML`` is the single source of defaults for every section of `federation.config.sections` (the FedSAF
paper's hyper-parameters, paper 001, Sec. 3-4: ``nhead`` of Eq. 1, alpha_k, sigma, lambda and ``dm`` of Eq. 3-8 and
16-18, the Fisher toggles of Eq. 12-15 and 19-20; the seed methods of papers 000, 002, 003 and 004); a preset in
``configs/`` lists only what it changes. The sections written out here are followed by those the methods declare in
their specs (`federation.methods.Setting`; ``declared_toml``). The tuples below are the values an enumerated field may
take; the dashboard's form offers the same ones. Nothing here imports torch.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from federation.methods import SPECS, StrategySpec
from infra.toml import toml_value

# The single source of default values, with the declared sections appended (``DEFAULTS_TOML`` below). A field
# missing here has a Python default of None, meaning "decided later" (``strategy.nhead``: the chosen strategy's own
# default; ``client.head_lr``: same as lr).
_WRITTEN_TOML = """
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
# Arithmetic of training and evaluation on a GPU: "fp32", or "bf16" (autocast, where the GPU supports it).
precision = "fp32"
# Deterministic GPU kernels (the same seed gives the same metrics.jsonl run to run on one GPU); false opts out.
deterministic = true
# Before hospitals or ablation cells share one GPU, refuse what the memory estimate says will not fit
# (federation/hospital/gpu_memory.py); false runs them anyway, for when the estimate is known to be too high.
check_gpu_memory = true
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
# "local_stats", was chosen by measurement (configs/ablation_fairness.toml, results/README.md): on the
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
# The server's safeguards against a hostile hospital (docs/federation.md, "Bounding a hospital's weight" and
# "Robust aggregation"). Every one is unset by default: a run without them aggregates exactly as before.
#
# The largest weight any one hospital may get in any aggregate, for every method that shares: FedAvg's n_i / n
# (fedavg, fedprox, fedrep, fedbn), the Fisher weights gamma (fedsaf, fedas), each layer's weights (depthwise_fim),
# each value's weights (precision_weighted), AMP's weights of other hospitals (fedamp, fedsaf). Weights above it
# are capped and the excess is spread over the other hospitals in proportion to their weights
# (federation.strategies.aggregation.cap_weights; AMP's excess stays with the hospital's own model). Must be >= 1/m for
# m
# hospitals (weights sum to 1). Example:
# max_weight = 0.5
#
# Robust aggregation for the averaging methods (fedavg, fedprox, fedrep, fedbn, fedas, depthwise_fim,
# precision_weighted): "norm_bound" clips every hospital's update (its shared tensors minus the round's global
# model) to norm_factor times the round's median update norm (Sun et al., 2019); "trimmed_mean" (fedavg, fedprox,
# fedrep, fedbn) replaces the weighted average by the coordinate-wise mean of the values left after dropping the
# trim largest and trim smallest (Yin et al., 2018). norm_bound needs max_weight below 0.5 (it bounds an update's
# size, not its weight) and at least 3 hospitals; trimmed_mean needs at least 2 trim + 1 hospitals: otherwise the
# run is refused. Neither covers many colluding hospitals (two of three are not detected), small scaled
# updates, or FedSAF's and FedAMP's attention weights. Examples:
# robust = "norm_bound"        # with max_weight = 0.4, say (below 0.5, at least 1/m)
# norm_factor = 1.0           # with norm_bound: the bound is norm_factor x the median update norm (1 to 10, default 1)
# robust = "trimmed_mean"
# trim = 1                    # with trimmed_mean: hospitals dropped at each end, per value (default 1)
#
# The most training or test tiles a hospital may declare in its Hello; a hospital declaring more (or a count that
# is not a whole number in [0, 2^53]) is named and left out of the run. Unset: only the 2^53 bound. Example:
# max_examples = 10000000

[privacy]
# Differential privacy at every hospital (federation.hospital.privacy, docs/privacy.md): DP-SGD in every training phase,
# a slide as the protected unit, accounted with Opacus's RDP accountant. Off unless noise_multiplier is set; it
# needs model.norm = "group" (BatchNorm mixes the slides of a batch and keeps statistics of private data).
# noise_multiplier = 1.0      # sigma: the noise's standard deviation over the clip norm
# max_grad_norm = 1.0         # C: each slide's gradient is clipped to this L2 norm
# sample_rate = 0.1           # q: each step takes every slide with this probability (Poisson sampling)
# delta = 1e-5                # epsilon is reported at this delta (default 1e-5)
# unit = "slide"              # "slide" (the default) or "tile" (for comparison only: protects a tile, not a patient)
# tiles_per_unit = 8          # at most this many of a sampled slide's tiles (at random) per step (default 8)
"""


def declared_toml(specs: Sequence[StrategySpec]) -> str:
    """The sections ``[<method>]`` that ``specs`` declare (`federation.methods.Setting`) as TOML, each setting's
    help as the comment above its default; empty when none declares one."""
    blocks = []
    for spec in specs:
        if not spec.section:
            continue
        lines = [f"[{spec.name}]"]
        for setting in spec.section:
            lines.extend(f"# {line}" for line in textwrap.wrap(setting.help, 110))
            lines.append(f"{setting.name} = {toml_value(setting.default)}")
        blocks.append("\n".join(lines) + "\n")
    return "".join(f"\n{block}" for block in blocks)


DEFAULTS_TOML = _WRITTEN_TOML + declared_toml(SPECS)

DEVICES = ("cpu", "cuda", "auto")
PRECISIONS = ("fp32", "bf16")
ENGINES = ("local", "flower-sim", "flower")
OPTIMIZERS = ("sgd", "adam")
BN_MODES = ("shared", "local_stats", "local")
STARTS = ("centre", "own")
FISHER_ESTIMATORS = ("per_sample", "full_pass")
NORMS = ("batch", "group")
DP_UNITS = ("slide", "tile")
AMP_METRICS = ("euclidean", "manhattan", "cosine", "cosine_distance")
AMP_SCALES = ("raw", "per_value", "relative")  # federation.strategies.amp.SCALES
TLU_GROUPINGS = ("body", "shapes")
ROBUST_METHODS = ("norm_bound", "trimmed_mean")  # server.robust (federation.strategies.robust)
