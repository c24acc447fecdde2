"""The Federation form's checks: every reason the form's settings cannot run, found before a process starts,
one message per invalid field and one for each problem that belongs to no single field.

Every setting is a field of ``federation.config`` (``section.key``), and every check is the engine's own:
a field is checked by building its section of the run configuration (``federation.config.SECTIONS``) from the
preset with that one value changed, so each invalid field gets its own message, in the words
``gastric-fl train`` would use; then the whole configuration is loaded exactly as the CLI loads it
(``federation.config.load_config``: the preset, the ``--set`` overrides, ``--data``) for the rules between
fields (an error about one key, ``FederationError.key``, goes to that key's field; any other is a general problem);
then the checks the engine makes when a run starts, before its first round: the AMP bound
``alpha_k x (hospitals - 1) <= sigma`` (``federation.bounds.amp_bound_problem``; FedSAF paper Eq. 3-8,
16-18: ``A'(x) = exp(-x/sigma)/sigma <= 1/sigma`` keeps ``xi_ii >= 0``), ``nhead`` within the model's layer
units (Eq. 1), the input size the model needs, the head-first rules of FedRep and FedSAF (Eq. 24), and what
``server.robust`` needs of the dataset's hospitals (``federation.bounds.robust_problem``).

Nothing here imports torch, the checks included: the strategies' names and defaults come from the registry
(``federation.methods``), the models' names, input sizes and layer units from ``models.names``, and
the AMP bound from ``federation.bounds.amp_bound_problem``, all torch-free, so the page settles without waiting
on torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.dashboard.commands import overrides
from app.dashboard.fields import FIELDS, FIELDS_BY_KEY, SHORT_NAMES, Field, model_units
from app.dashboard.presets import resolve_preset
from federation.bounds import amp_bound_problem, robust_problem
from federation.config import SECTIONS, load_config
from federation.errors import FederationError
from federation.methods import OWN_START, SPEC, default_nhead, split_on
from models.errors import ModelError
from models.names import check_input_size


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
    ``None`` when the engine accepts it. A complaint about another key of the section (its ``key``) is not this
    field's."""
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
        if exc.key is not None and exc.key != item.key:
            return None
        return _field_message(item, value, str(exc))
    except (TypeError, ValueError) as exc:  # the preset's section itself is incomplete or malformed
        return f"{item.label}: {exc}"
    return None


def _named_field(error: ValueError, values: Mapping[str, Any]) -> Field | None:
    """The field of the form a configuration error is about (``FederationError.key``), if the chosen method reads
    it; ``None`` for an error about no single key or about a setting the form does not offer."""
    key = error.key if isinstance(error, FederationError) else None
    item = FIELDS_BY_KEY.get(key) if key is not None else None
    return item if item is not None and item.applies(values) else None


def _start_problems(config: Any, num_hospitals: int | None) -> list[tuple[str | None, str]]:
    """What the engine refuses when a run starts, before round 1 (federation/server/loop.py, the strategies), as
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
    spec = SPEC[name]  # the method's rules (federation.methods), as its own build() checks them
    if spec.fixed_nhead is not None and nhead != spec.fixed_nhead:
        sentence = f"{spec.short_name} shares the whole model, so strategy.nhead must be {spec.fixed_nhead}"
        problems.append((None, f"{sentence} (the preset sets {nhead})."))
    if nhead < spec.min_nhead:
        sentence = (
            f"nhead = {nhead}: {spec.short_name} needs a local head, so use {spec.min_nhead} or more (or FedAvg)."
        )
        problems.append(("strategy.nhead", sentence))
    # a method with a split switch (FedSAF's fedsaf.split) trains a head first only where it splits, with a head
    split = spec.head_first and (spec.split_switch is None or (split_on(config) and nhead > 0))
    if split and config.client.head_epochs < 1:
        sentence = f"Head epochs = {config.client.head_epochs}: {SHORT_NAMES[name]} trains the head first (Eq. 24)"
        problems.append(("client.head_epochs", f"{sentence}, so use 1 or more."))
    if num_hospitals is not None and num_hospitals < 2 and spec.shares:
        problems.append((None, f"The dataset has {num_hospitals} hospital(s): a federation needs at least 2."))
    # (the distance itself, amp.dm or fedamp.dm, was checked with its section)
    if (
        name in OWN_START
        and num_hospitals is not None
        and num_hospitals >= 2
        and amp_bound_problem(num_hospitals, config.amp.alpha_k, config.amp.sigma) is not None
    ):
        peers = num_hospitals - 1
        problems.append(
            (
                "amp.alpha_k",
                f"alpha_k x (hospitals - 1) = {config.amp.alpha_k:g} x {peers} = {config.amp.alpha_k * peers:g} "
                f"exceeds sigma = {config.amp.sigma:g}, so a hospital's weight on its own model could turn "
                f"negative: lower alpha_k to at most {config.amp.sigma / peers:g} or raise sigma.",
            )
        )
    # what server.robust needs of the hospitals that will answer (the strategies' own check at the start)
    server = config.server
    robust = robust_problem(num_hospitals or 0, server.robust, server.trim_count, server.max_weight)
    if robust is not None:
        problems.append((robust[0] if robust[0] in FIELDS_BY_KEY else None, robust[1]))
    return problems


def check(
    preset: Path | None,
    dataset: Path | None,
    values: Mapping[str, Any],
    num_hospitals: int | None,
) -> Checked:
    """Every reason these settings cannot run, as ``gastric-fl train`` would refuse them (module docstring).

    Reads the preset and ``dataset``'s files; imports no torch.
    """
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
        named = _named_field(exc, values)
        if named is not None and named.key not in found:
            found[named.key] = _field_message(named, values.get(named.key), message)
        elif named is None:
            general.append(message)
    else:
        for key, message in _start_problems(config, num_hospitals):
            if key is not None and key in FIELDS_BY_KEY and FIELDS_BY_KEY[key].applies(values):
                found.setdefault(key, message)
            else:
                general.append(message)
    ordered = {f.key: found[f.key] for f in FIELDS if f.key in found}
    return Checked(ordered, general)
