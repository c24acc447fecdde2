"""The commands the dashboard starts: the ``gastric-fl train`` command line that carries the form's settings
(``--set section.key=value``, only what the method reads and the preset does not already say), the demo's
``synth`` and ``prepare`` commands, a new run's folder name, and the sentences that describe a run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.dashboard.fields import FIELDS, SHORT_NAMES
from app.dashboard.presets import baseline
from infra.toml import toml_value


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
