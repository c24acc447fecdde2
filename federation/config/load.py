"""Loading a run configuration: the defaults, then a TOML preset, then ``--set section.key=value`` overrides, then
``--data``; and writing one back as TOML (``config_to_toml``).

Loading is strict: an unknown section or key, a value of the wrong type, or a value out of range is rejected with a
``FederationError`` that names it and says what is allowed; an error about one key carries it as ``.key``. After the
sections have checked themselves, ``config_from_dict`` applies the rules between sections (an optimiser that
precision_weighted needs, paper 004; a ``client.start`` only FedAMP and FedSAF support; ``server.max_weight`` only for
strategies that share; ``server.robust`` only for the averaging ones; DP-SGD only without batch statistics; a method's
own setting, written or declared in its spec, changed only when that method runs). Nothing here imports torch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from federation.bounds import max_weight_problem, robust_problem
from federation.config.defaults import DEFAULTS_TOML
from federation.config.sections import DECLARED, SECTIONS, RunConfig, _fail
from federation.errors import FederationError
from federation.methods import (
    AVERAGING,
    EXAMPLE_WEIGHTED,
    OWN_START,
    SPEC,
    SPECS,
    STRATEGY_NAMES,
    default_nhead,
    readers,
)
from infra.toml import toml_value


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
    raise FederationError(f"config {where} = {value!r} has the wrong type: expected {names}", key=where)


def _check_known(raw: Mapping[str, Any], source: str) -> None:
    for section, values in raw.items():
        if section not in SECTIONS:
            raise FederationError(f"{source}: unknown section [{section}]; known sections: {', '.join(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise FederationError(f"{source}: [{section}] must be a table of key = value pairs")
        known = [f.name for f in dataclasses.fields(SECTIONS[section])]
        for key in values:
            if key not in known:
                raise FederationError(
                    f"{source}: unknown key {section}.{key}; [{section}] accepts {', '.join(known)}",
                    key=f"{section}.{key}",
                )


def _merge(base: dict[str, dict[str, Any]], extra: Mapping[str, Any]) -> None:
    for section, values in extra.items():
        base.setdefault(section, {}).update(values)


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split ``section.key=value``; the value is read as TOML (``0.1``, ``true``, ``[0, 1]``), else as a string."""
    target, sep, raw = text.partition("=")
    section, dot, key = target.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise FederationError(f"--set {text!r}: write it as section.key=value, e.g. --set run.rounds=3")
    if any(c in text for c in "\n\r"):
        raise FederationError(
            f"--set {text[:80]!r}: one setting per --set, on one line (a line break would add settings unseen)"
        )
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as fedavg or cpu
    return section, key.strip(), value


@functools.cache
def _defaults() -> dict[str, dict[str, Any]]:
    """``DEFAULTS_TOML`` parsed once per process (read-only: `config_from_dict` merges a deep copy)."""
    return tomllib.loads(DEFAULTS_TOML)


def config_from_dict(raw: Mapping[str, Any], source: str = "config") -> RunConfig:
    """Build a ``RunConfig`` from the defaults updated by ``raw`` (nested ``{section: {key: value}}``)."""
    _check_known(raw, source)
    merged: dict[str, dict[str, Any]] = {}
    _merge(merged, copy.deepcopy(_defaults()))
    _merge(merged, raw)
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        values = {key: _coerce(f"{name}.{key}", value, hints[key]) for key, value in merged.get(name, {}).items()}
        try:
            sections[name] = cls(**values)
        except TypeError as exc:
            raise FederationError(f"{source}: [{name}] is incomplete ({exc})") from exc
    declared = {name: sections.pop(name) for name in DECLARED}
    config = RunConfig(**sections, declared=declared)
    if config.client.epochs + config.client.head_epochs == 0:
        _fail("client.epochs", 0, "train for at least one epoch (client.epochs or client.head_epochs > 0)")
    _check_unused(config, "adam", config.client.optimizer == "adam", 'they apply only with client.optimizer = "adam"')
    spec = SPEC[config.strategy.name]
    if spec.optimizer is not None and config.client.optimizer != spec.optimizer:
        _fail(
            "client.optimizer",
            config.client.optimizer,
            f"{spec.name} needs it: {spec.optimizer_reason}; set client.optimizer = {spec.optimizer}",
        )
    if config.client.start == "own" and config.strategy.name not in OWN_START:
        _fail(
            "client.start",
            "own",
            f"only {', '.join(sorted(OWN_START))} give each hospital a centre to be pulled toward; "
            f"with {config.strategy.name} a hospital would train alone: use client.start = centre",
        )
    _check_own_settings(config)
    _check_max_weight(config)
    _check_robust(config)
    if config.privacy.enabled and config.model.norm != "group":
        _fail(
            "model.norm",
            config.model.norm or "batch",
            "differential privacy needs a normalisation without batch statistics: set model.norm = group",
        )
    return config


def _check_max_weight(config: RunConfig) -> None:
    """Refuse ``server.max_weight`` for a strategy that shares nothing (there is no aggregate to cap: it would
    mislead), and a cap below ``1/m`` when ``strategy.clients`` names the ``m`` hospitals (else: at run start)."""
    cap = config.server.max_weight
    if cap is None:
        return
    name = config.strategy.name
    if not SPEC[name].shares:
        raise FederationError(
            f"config server.max_weight = {cap!r} does not apply to strategy {name}: it shares nothing, so there is "
            "no aggregate whose weights to cap: leave server.max_weight unset",
            key="server.max_weight",
        )
    if not isinstance(config.strategy.clients, str):
        problem = max_weight_problem(len(config.strategy.clients), cap)
        if problem is not None:
            raise FederationError(problem, key="server.max_weight")


def _check_robust(config: RunConfig) -> None:
    """Refuse ``server.robust`` for a strategy it cannot apply to: norm bounding needs one global model to measure
    updates against (the averaging strategies), the trimmed mean replaces ``n_i / n`` (the example-weighted ones, and
    then ``server.max_weight`` has nothing to cap); norm bounding without a weight cap below 1/2, and a defence with
    fewer hospitals listed than it needs (`federation.bounds.robust_problem`)."""
    server = config.server
    method = server.robust
    if method is None:
        return
    name = config.strategy.name
    allowed = AVERAGING if method == "norm_bound" else EXAMPLE_WEIGHTED
    if name not in allowed:
        names = ", ".join(n for n in STRATEGY_NAMES if n in allowed)
        why = (
            "it bounds updates against one global model"
            if method == "norm_bound"
            else "it replaces the example-weighted average"
        )
        _fail("server.robust", method, f"{why}, which strategy {name} does not have: use it with {names}")
    if method == "trimmed_mean" and server.max_weight is not None:
        _fail(
            "server.max_weight",
            server.max_weight,
            "the trimmed mean weighs every value it keeps equally, so there is nothing to cap: leave server.max_weight "
            'unset with server.robust = "trimmed_mean"',
        )
    # what the defence needs (a weight cap for norm bounding; enough hospitals): here with the hospitals listed,
    # when the run starts with strategy.clients = "all" (federation.strategies.fedavg.Averaging)
    listed = 0 if isinstance(config.strategy.clients, str) else len(config.strategy.clients)
    problem = robust_problem(listed, method, server.trim_count, server.max_weight)
    if problem is not None:
        key, message = problem
        raise FederationError(message, key=key)


def _check_own_settings(config: RunConfig) -> None:
    """Refuse a method's own setting (`StrategySpec.owned`: its ``settings``, e.g. ``fedprox.mu``, and its declared
    section's) changed from its default when the run's method does not read it: it would silently do nothing."""
    defaults = _defaults()
    for key in sorted({key for spec in SPECS for key in spec.owned}):
        owners = readers(key)
        if config.strategy.name in owners:
            continue
        section, _, name = key.partition(".")
        value = getattr(config.section(section), name)
        if value != defaults[section][name]:
            _fail(
                key,
                value,
                f"leave it at its default: it applies only with strategy.name = {' or '.join(sorted(owners))}",
            )


def _check_unused(config: RunConfig, section: str, applies: bool, why: str) -> None:
    """Refuse a setting changed from its default in a section the run does not use (it would silently do nothing)."""
    if applies:
        return
    defaults = _defaults().get(section, {})
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
    if section in config.declared:
        changed = dataclasses.replace(config.declared[section], **values)
        return dataclasses.replace(config, declared={**config.declared, section: changed})
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **values)})


def resolve_config(config: RunConfig) -> RunConfig:
    """Fill in what the configuration left to the strategy (``nhead``: the method's default local layer units,
    ``federation.methods.default_nhead``) and to the hospital (``head_lr``: ``client.lr``)."""
    if config.strategy.nhead is None:
        config = with_values(config, "strategy", nhead=default_nhead(config.strategy.name))
    if config.client.head_lr is None:
        config = with_values(config, "client", head_lr=config.client.lr)
    return config


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
