"""A hospital's own policy: what it agrees to run and what it lets leave (docs/design.md, "Trust model").

The server proposes; the hospital decides. Every check here runs at the hospital, on the hospital's own copy of
the rules, before anything is trained, loaded, written or sent:

- **What may leave.** The hospital computes the keys it sends from the agreed model and its policy
  (``agreed_shared_keys``: every layer unit but the last ``nhead`` of FedSAF paper 001 Eq. 1, less the BatchNorm
  entries the hospital keeps), never from the server's list. ``min_nhead`` units on the output side always stay
  (its personal head); BatchNorm running statistics stay unless ``share_batchnorm_statistics``.
- **What it accepts.** Methods, rounds, epochs, learning rates, input size and batch sizes within bounds; a
  recipe (``federation.wire.contract.Recipe``) within the same bounds, with finite numbers.
- **No path the server names.** ``model.weights`` in a run's configuration must be empty or the file the
  hospital's policy names itself (``weights``): a hospital never opens a file because the server asked.
- **What it loads.** Received tensors must be exactly named, shaped and typed as the agreed model's and finite.

The policy file is TOML (``gastric-fl federation hospital --policy FILE``; documented in docs/deployment.md,
"Hospital policy"); every key is optional and a missing file means the safe defaults of ``HospitalPolicy()``.
The in-process engines, where one operator is the server and every hospital, use ``HospitalPolicy.operator``:
the same tensor, key and finiteness checks, with the operator's own configuration accepted as it is.
"""

from __future__ import annotations

import math
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from federation.config import DP_UNITS, FISHER_ESTIMATORS, OPTIMIZERS, RunConfig
from federation.errors import FederationError
from federation.hospital.privacy import planned_dp_steps
from federation.methods import SPEC, STRATEGY_NAMES, bn_mode
from federation.strategies.context import shared_nhead, with_privacy
from federation.wire.contract import Recipe
from models import base_keys, batchnorm_keys, split_units

POLICY_EXAMPLE = "configs/hospital_policy.toml"


class PolicyRefusal(FederationError):
    """The server asked for something this hospital's policy does not allow (the reason names the rule)."""


@dataclass(frozen=True)
class HospitalPolicy:
    """One hospital's rules. Defaults are safe: a personal head of at least one unit, BatchNorm statistics kept,
    every method that keeps a head, bounded training, no weights file."""

    min_nhead: int = 1
    share_batchnorm_statistics: bool = False
    methods: tuple[str, ...] = STRATEGY_NAMES
    max_rounds: int = 1000
    max_epochs: int = 50
    min_lr: float = 1e-7
    max_lr: float = 1.0
    max_prox_mu: float = 1e4
    max_input_size: int = 1024
    max_batch_size: int = 1024
    max_fisher_batch: int = 4096
    weights: str = ""
    # Differential privacy (federation.hospital.privacy, docs/privacy.md): with max_epsilon set, every training round
    # must be
    # DP-SGD at a delta of at most max_delta, and a round that would take the hospital's epsilon past max_epsilon is
    # refused. None: DP is not required (a run may still ask for it).
    max_epsilon: float | None = None
    max_delta: float = 1e-5
    # What any DP-SGD this hospital trains must be, whoever asks (docs/privacy.md, "Enforced by the hospital"): the
    # unit its guarantee protects, and bounds on the noise, the sampling rate, the clip norm, the tiles a unit
    # contributes and the steps of one round. A run or recipe outside them is refused in one line.
    dp_unit: str = "slide"
    min_noise_multiplier: float = 0.0
    max_sample_rate: float = 1.0
    max_clip_norm: float = 100.0
    max_tiles_per_unit: int = 64
    max_dp_steps: int = 10_000
    source: str = "the default hospital policy"

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in STRATEGY_NAMES]
        if unknown:
            raise FederationError(
                f"{self.source}: methods names unknown {unknown}; use any of {', '.join(STRATEGY_NAMES)}"
            )
        for name in (
            "min_nhead",
            "max_rounds",
            "max_epochs",
            "max_input_size",
            "max_batch_size",
            "max_fisher_batch",
            "max_tiles_per_unit",
            "max_dp_steps",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FederationError(f"{self.source}: {name} = {value!r}; use a whole number >= 0")
        for name in ("min_lr", "max_lr", "max_prox_mu", "min_noise_multiplier", "max_clip_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise FederationError(f"{self.source}: {name} = {value!r}; use a finite number >= 0")
        if self.max_epsilon is not None and (
            isinstance(self.max_epsilon, bool)
            or not isinstance(self.max_epsilon, int | float)
            or not math.isfinite(self.max_epsilon)
            or self.max_epsilon <= 0
        ):
            raise FederationError(f"{self.source}: max_epsilon = {self.max_epsilon!r}; use a finite number > 0")
        if (
            isinstance(self.max_delta, bool)
            or not isinstance(self.max_delta, int | float)
            or not 0 < self.max_delta < 1
        ):
            raise FederationError(f"{self.source}: max_delta = {self.max_delta!r}; use a probability in (0, 1)")
        if self.dp_unit not in DP_UNITS:
            raise FederationError(f"{self.source}: dp_unit = {self.dp_unit!r}; use one of {', '.join(DP_UNITS)}")
        if (
            isinstance(self.max_sample_rate, bool)
            or not isinstance(self.max_sample_rate, int | float)
            or not (0 < self.max_sample_rate <= 1)
        ):
            raise FederationError(
                f"{self.source}: max_sample_rate = {self.max_sample_rate!r}; use a probability in (0, 1]"
            )
        if self.min_lr > self.max_lr:
            raise FederationError(f"{self.source}: min_lr {self.min_lr} is above max_lr {self.max_lr}")

    @classmethod
    def operator(cls, config: RunConfig) -> HospitalPolicy:
        """The in-process engines' policy: the operator is every party, so its configuration is the policy (its
        head size, BatchNorm choice and weights file); the tensor and finiteness checks still apply."""
        return cls(
            min_nhead=0,
            share_batchnorm_statistics=True,
            max_rounds=max(config.run.rounds, cls.max_rounds),
            max_epochs=max(config.client.epochs, config.client.head_epochs, cls.max_epochs),
            min_lr=0.0,
            max_lr=max(config.client.lr, config.client.head_lr or 0.0, cls.max_lr),
            max_prox_mu=sys.float_info.max,
            max_input_size=max(config.data.input_size, cls.max_input_size),
            max_batch_size=max(config.data.batch_size, config.data.eval_batch_size, cls.max_batch_size),
            max_fisher_batch=max(config.fedsaf.fisher_batch, cls.max_fisher_batch),
            weights=config.model.weights,
            max_delta=max(config.privacy.run_delta, cls.max_delta),
            dp_unit=config.privacy.unit or "slide",
            max_sample_rate=1.0,
            max_clip_norm=max(config.privacy.max_grad_norm or 0.0, cls.max_clip_norm),
            max_tiles_per_unit=max(config.privacy.tiles_per_unit or 0, cls.max_tiles_per_unit),
            max_dp_steps=sys.maxsize,
            source="the operator's configuration",
        )


# The policy file's sections and the keys each holds (configs/hospital_policy.toml); a key may also stand at the top.
POLICY_SECTIONS: dict[str, tuple[str, ...]] = {
    "share": ("min_nhead", "share_batchnorm_statistics"),
    "accept": (
        "methods",
        "max_rounds",
        "max_epochs",
        "min_lr",
        "max_lr",
        "max_prox_mu",
        "max_input_size",
        "max_batch_size",
        "max_fisher_batch",
    ),
    "privacy": (
        "max_epsilon",
        "max_delta",
        "dp_unit",
        "min_noise_multiplier",
        "max_sample_rate",
        "max_clip_norm",
        "max_tiles_per_unit",
        "max_dp_steps",
    ),
    "model": ("weights",),
}


def load_policy(path: Path | None) -> HospitalPolicy:
    """The policy in TOML file ``path`` (``None``: the defaults); one line naming the file and key on error: an
    unknown section, a key in another section than its own, or a key given twice is refused, never resolved by
    which came last."""
    if path is None:
        return HospitalPolicy()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FederationError(f"hospital policy {path} cannot be read ({exc.strerror or exc}): check the path") from exc
    except UnicodeDecodeError as exc:
        raise FederationError(
            f"hospital policy {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 (see {POLICY_EXAMPLE})"
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise FederationError(f"hospital policy {path} is not valid TOML ({exc}); see {POLICY_EXAMPLE}") from exc
    home = {key: section for section, keys in POLICY_SECTIONS.items() for key in keys}
    flat: dict[str, Any] = {}
    for name, values in raw.items():
        if isinstance(values, dict):
            if name not in POLICY_SECTIONS:
                raise FederationError(
                    f"hospital policy {path}: unknown section [{name}]; use "
                    f"{', '.join(f'[{n}]' for n in POLICY_SECTIONS)} (see {POLICY_EXAMPLE})"
                )
            items: list[tuple[str, Any, str | None]] = [(key, value, name) for key, value in values.items()]
        else:
            items = [(name, values, None)]
        for key, value, section in items:
            if key not in home:
                raise FederationError(
                    f"hospital policy {path}: unknown key {key!r}; use any of {', '.join(sorted(home))} "
                    f"(see {POLICY_EXAMPLE})"
                )
            if section is not None and home[key] != section:
                raise FederationError(f"hospital policy {path}: {key} belongs in [{home[key]}], not [{section}]")
            if key in flat:
                raise FederationError(f"hospital policy {path}: {key} is given twice; keep one")
            flat[key] = value
    if "methods" in flat:
        if not isinstance(flat["methods"], list) or not all(isinstance(m, str) for m in flat["methods"]):
            raise FederationError(f"hospital policy {path}: methods must be a list of method names")
        flat["methods"] = tuple(flat["methods"])
    for key in ("weights", "dp_unit"):
        if key in flat and not isinstance(flat[key], str):
            raise FederationError(f"hospital policy {path}: {key} must be a string")
    for key in ("share_batchnorm_statistics",):
        if key in flat and not isinstance(flat[key], bool):
            raise FederationError(f"hospital policy {path}: {key} must be true or false")
    return HospitalPolicy(**flat, source=f"hospital policy {path}")


def _refuse(policy: HospitalPolicy, text: str) -> PolicyRefusal:
    return PolicyRefusal(f"refused by {policy.source}: {text}")


def check_config(policy: HospitalPolicy, config: RunConfig) -> None:
    """Refuse (``PolicyRefusal``, one line) a run whose configuration ``policy`` does not accept."""
    name = config.strategy.name
    if name not in policy.methods:
        raise _refuse(policy, f"method {name!r} is not one of the accepted methods {list(policy.methods)}")
    nhead = shared_nhead(config)
    shares = SPEC[name].shares  # Separate shares nothing: no unit and no statistic leaves the hospital
    if shares and nhead < policy.min_nhead:
        raise _refuse(
            policy,
            f"{name} with nhead {nhead} would send layer units this hospital keeps (at least {policy.min_nhead} "
            "output-side units stay here)",
        )
    if shares and bn_mode(name, config.strategy.bn) == "shared" and not policy.share_batchnorm_statistics:
        raise _refuse(policy, "strategy.bn = shared would send the BatchNorm statistics this hospital keeps")
    if config.model.weights and config.model.weights != policy.weights:
        raise _refuse(
            policy,
            "the run names a weights file (model.weights); a hospital opens no path the server names: name it in "
            "the hospital policy (weights = ...) to start from it",
        )
    bounds = [
        ("run.rounds", config.run.rounds, policy.max_rounds),
        ("client.epochs", config.client.epochs, policy.max_epochs),
        ("client.head_epochs", config.client.head_epochs, policy.max_epochs),
        ("data.input_size", config.data.input_size, policy.max_input_size),
        ("data.batch_size", config.data.batch_size, policy.max_batch_size),
        ("data.eval_batch_size", config.data.eval_batch_size, policy.max_batch_size),
        ("fedsaf.fisher_batch", config.fedsaf.fisher_batch, policy.max_fisher_batch),
    ]
    for key, value, most in bounds:
        if value > most:
            raise _refuse(policy, f"{key} = {value} is above this hospital's limit {most}")
    for key, lr in (("client.lr", config.client.lr), ("client.head_lr", config.client.head_lr)):
        if lr is not None and not policy.min_lr <= lr <= policy.max_lr:
            raise _refuse(policy, f"{key} = {lr} is outside this hospital's range [{policy.min_lr}, {policy.max_lr}]")
    if config.privacy.enabled:
        check_privacy(policy, with_privacy(Recipe(), config))
    elif policy.max_epsilon is not None:
        raise _refuse(policy, _DP_REQUIRED.format(policy.max_epsilon))


_DP_REQUIRED = (
    "this hospital trains only with differential privacy (max_epsilon {:g}), and the run asks for none: set [privacy] "
    "in the run's configuration"
)
_DP_FIELDS = ("dp_noise_multiplier", "dp_max_grad_norm", "dp_sample_rate", "dp_unit", "dp_tiles_per_unit", "dp_delta")


def check_privacy(policy: HospitalPolicy, recipe: Recipe) -> None:
    """Refuse DP-SGD (a private ``recipe``) that ``policy`` does not allow: another unit than the hospital's
    ``dp_unit``, less noise than ``min_noise_multiplier``, a sampling rate, clip norm, tiles per unit or number of
    steps in a round (`federation.hospital.privacy.planned_dp_steps`) outside its bounds, a delta above
    ``max_delta``."""
    if not recipe.private:
        return
    if recipe.dp_unit != policy.dp_unit:
        raise _refuse(
            policy,
            f"the run's DP-SGD protects a {recipe.dp_unit!r}, this hospital's budget counts {policy.dp_unit!r} units "
            "(dp_unit): set privacy.unit to match",
        )
    sigma, clip, rate = recipe.dp_noise_multiplier, recipe.dp_max_grad_norm, recipe.dp_sample_rate
    if not (math.isfinite(sigma) and sigma > 0 and sigma >= policy.min_noise_multiplier):
        raise _refuse(
            policy, f"DP noise multiplier {sigma:g} is below this hospital's least "
            f"{max(policy.min_noise_multiplier, 0):g} (min_noise_multiplier; it must be > 0)"
        )  # fmt: skip
    if not 0 < rate <= policy.max_sample_rate:
        raise _refuse(policy, f"DP sample rate {rate:g} is outside (0, {policy.max_sample_rate:g}] (max_sample_rate)")
    if not (math.isfinite(clip) and 0 < clip <= policy.max_clip_norm):
        raise _refuse(policy, f"DP clip norm {clip:g} is outside (0, {policy.max_clip_norm:g}] (max_clip_norm)")
    if not 1 <= recipe.dp_tiles_per_unit <= policy.max_tiles_per_unit:
        raise _refuse(
            policy,
            f"DP tiles per unit {recipe.dp_tiles_per_unit} is outside [1, {policy.max_tiles_per_unit}] "
            "(max_tiles_per_unit)",
        )
    if not 0 < recipe.dp_delta <= policy.max_delta:
        raise _refuse(
            policy, f"the run's delta {recipe.dp_delta:g} is above this hospital's max_delta {policy.max_delta:g}"
        )
    steps = planned_dp_steps(recipe)
    if steps > policy.max_dp_steps:
        raise _refuse(
            policy,
            f"a round of this DP-SGD takes {steps} steps (sample rate {rate:g}), more than this hospital's "
            f"max_dp_steps {policy.max_dp_steps}",
        )


def check_agreed_privacy(policy: HospitalPolicy, recipe: Recipe, config: RunConfig) -> None:
    """Refuse a recipe whose DP-SGD differs from the run's ``[privacy]``, the one the hospital accepted at the Hello
    (`check_config`): the server cannot drop the noise, change it, or change the unit after the start."""
    agreed = with_privacy(Recipe(), config)
    if recipe.private != agreed.private:
        what = "no DP-SGD" if agreed.private else "DP-SGD"
        raise _refuse(
            policy,
            f"the round asks for {what}, the run agreed {'DP-SGD' if agreed.private else 'none'} "
            "([privacy] of the Hello)",
        )
    if not recipe.private:
        return
    for name in _DP_FIELDS:
        sent, kept = getattr(recipe, name), getattr(agreed, name)
        if sent != kept:
            raise _refuse(
                policy, f"the round's {name.removeprefix('dp_')} {sent!r} differs from the run's agreed {kept!r} "
                "([privacy] of the Hello)"
            )  # fmt: skip


def check_recipe(policy: HospitalPolicy, recipe: Recipe) -> None:
    """Refuse a training recipe with numbers that are not finite, negative, or outside ``policy``'s bounds."""
    for f in fields(Recipe):
        value = getattr(recipe, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise _refuse(policy, f"recipe {f.name} = {value} is not a finite number")
    lrs = [("lr", recipe.lr)] + ([("head_lr", recipe.head_lr)] if recipe.head_lr is not None else [])
    for key, lr in lrs:
        if not (lr > 0 and policy.min_lr <= lr <= policy.max_lr):
            raise _refuse(policy, f"recipe {key} = {lr} is outside this hospital's range (0, {policy.max_lr}]")
    for key in ("epochs", "head_epochs"):
        value = getattr(recipe, key)
        if not 0 <= value <= policy.max_epochs:
            raise _refuse(policy, f"recipe {key} = {value} is outside [0, {policy.max_epochs}]")
    if not 0 <= recipe.fisher_batch <= policy.max_fisher_batch:
        raise _refuse(policy, f"recipe fisher_batch = {recipe.fisher_batch} is outside [0, {policy.max_fisher_batch}]")
    if not 0 <= recipe.prox_mu <= policy.max_prox_mu:
        raise _refuse(policy, f"recipe prox_mu = {recipe.prox_mu} is outside [0, {policy.max_prox_mu:g}]")
    if recipe.optimizer not in OPTIMIZERS:
        raise _refuse(policy, f"recipe optimizer {recipe.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    if recipe.fisher_estimator not in FISHER_ESTIMATORS:
        raise _refuse(
            policy, f"recipe fisher_estimator {recipe.fisher_estimator!r} is not one of {', '.join(FISHER_ESTIMATORS)}"
        )
    ranges = [
        ("momentum", recipe.momentum, 0.0, 1.0),
        ("weight_decay", recipe.weight_decay, 0.0, 1.0),
        ("adam_beta1", recipe.adam_beta1, 0.0, 1.0),
        ("adam_beta2", recipe.adam_beta2, 0.0, 1.0),
    ]
    for key, value, low, high in ranges:
        if not low <= value <= high:
            raise _refuse(policy, f"recipe {key} = {value:g} is outside [{low:g}, {high:g}]")
    if not 0 < recipe.adam_eps <= 1:
        raise _refuse(policy, f"recipe adam_eps = {recipe.adam_eps:g} is outside (0, 1]")
    check_privacy(policy, recipe)


def check_budget(policy: HospitalPolicy, recipe: Recipe, spent: float, after: float | None) -> None:
    """Refuse, under a policy with ``max_epsilon``, a round that is not DP-SGD, whose delta is above ``max_delta``,
    or after which the hospital's epsilon (``after``, at the recipe's delta, from its own ledger) would pass
    ``max_epsilon``; ``spent``: its epsilon so far."""
    if policy.max_epsilon is None:
        return
    if not recipe.private:
        raise _refuse(policy, _DP_REQUIRED.format(policy.max_epsilon))
    check_privacy(policy, recipe)
    if after is not None and after > policy.max_epsilon:
        raise _refuse(
            policy,
            f"its privacy budget is spent: epsilon {spent:.3f} so far, {after:.3f} after this round, more than "
            f"max_epsilon {policy.max_epsilon:g} at delta {recipe.dp_delta:g}",
        )


def agreed_shared_keys(config: RunConfig, model: torch.nn.Module) -> list[str]:
    """The keys this hospital sends and loads under ``config`` (accepted by its policy): every layer unit but the
    last ``nhead`` (FedSAF paper 001, Eq. 1), less the BatchNorm entries the method keeps at the hospital. The same
    rule the server's strategies follow (``StrategyContext.shared_keys``), computed here from the hospital's own
    copy of the model."""
    if not SPEC[config.strategy.name].shares:  # Separate: nothing leaves the hospital
        return []
    mode = bn_mode(config.strategy.name, config.strategy.bn)
    local = set() if mode == "shared" else set(batchnorm_keys(model, affine=mode == "local"))
    return [k for k in base_keys(split_units(model), shared_nhead(config)) if k not in local]


def check_tensors(
    policy: HospitalPolicy,
    what: str,
    tensors: Mapping[str, torch.Tensor] | None,
    state: Mapping[str, torch.Tensor],
    allowed: Iterable[str],
) -> None:
    """Refuse received ``tensors`` unless each is one of the ``allowed`` keys, with the agreed model's shape and
    dtype (``state``), and finite."""
    if tensors is None:
        return
    allowed = set(allowed)
    foreign = sorted(k for k in tensors if k not in allowed)
    if foreign:
        raise _refuse(policy, f"{what} names tensors outside the shared part ({', '.join(foreign[:3])})")
    for key, value in tensors.items():
        expected = state[key]
        if tuple(value.shape) != tuple(expected.shape) or value.dtype != expected.dtype:
            raise _refuse(
                policy,
                f"{what} tensor {key} is {tuple(value.shape)} {value.dtype}, the agreed model's is "
                f"{tuple(expected.shape)} {expected.dtype}",
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise _refuse(policy, f"{what} tensor {key} is not finite")
