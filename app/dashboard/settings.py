"""The Federation page's settings: defaults from a TOML preset, validation before a run starts, and the
``gastric-fl train`` command line that carries them (``--set section.key=value``).

FedSAF paper (Miao et al., 2025): ``nhead`` layer units stay local (Eq. 1); AMP weights
``xi_ij = alpha_k * A'(d_ij)`` with ``A'(x) = exp(-x/sigma)/sigma <= 1/sigma`` (Eq. 3-8, 16-18), so
``xi_ii = 1 - sum_{j != i} xi_ij >= 0`` is guaranteed only when ``alpha_k * (m - 1) <= sigma``; ``lambda`` scales
the proximal term of the base update (Eq. 25); FIM on/off switches the Fisher reweighting (Eq. 19-20).
The same rules are enforced by the engine; checking them here refuses a bad run before a process starts.
"""

from __future__ import annotations

import math
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

ALGORITHMS = ("fedsaf", "fedamp", "fedavg", "fedprox", "fedrep", "separate")
ALGORITHM_NAMES = {
    "fedsaf": "FedSAF (split + AMP + Fisher)",
    "fedamp": "FedAMP (attentive message passing)",
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedrep": "FedRep (shared base, local head)",
    "separate": "Separate (local training only)",
}
DISTANCES = ("manhattan", "euclidean", "cosine", "cosine_distance")
# Which settings each algorithm reads; the page hides the others and does not pass them to the engine.
AMP_ALGORITHMS = ("fedsaf", "fedamp")
NHEAD_ALGORITHMS = ("fedsaf", "fedrep")
FEDSAF_ONLY = ("fedsaf",)
# MobileNetV3-Small has 15 layer units (features.0-12, classifier.0, classifier.3: DESIGN.md); the page asks
# the model registry for the real count of the preset's model when it can.
DEFAULT_UNITS = 15

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PRESETS_DIR = PROJECT_ROOT / "configs"
DEFAULT_PRESET = PRESETS_DIR / "demo.toml"

# Where each setting lives in the run configuration (federation/config.py; ``--set section.key=value``).
CONFIG_KEYS: dict[str, tuple[str, str]] = {
    "algorithm": ("strategy", "name"),
    "rounds": ("run", "rounds"),
    "local_epochs": ("client", "epochs"),
    "lr": ("client", "lr"),
    "nhead": ("strategy", "nhead"),
    "dm": ("amp", "dm"),
    "fim": ("fedsaf", "fim"),
    "split": ("fedsaf", "split"),
    "lam": ("amp", "lam"),
    "sigma": ("amp", "sigma"),
    "alpha_k": ("amp", "alpha_k"),
}


@dataclass(frozen=True)
class FederationSettings:
    """What a clinician may change before starting a federation; everything else comes from the preset.

    The Python defaults only stand in when no preset can be read; ``defaults_from`` takes the real ones from
    the engine's defaults and the chosen preset (federation/config.py, ``configs/*.toml``).
    """

    algorithm: str = "fedsaf"
    rounds: int = 10
    local_epochs: int = 1
    lr: float = 0.01
    nhead: int = 6
    dm: str = "manhattan"
    fim: bool = True
    split: bool = True
    lam: float = 0.05  # the engine's measured defaults (federation/config.py, docs/fedsaf.md)
    sigma: float = 1.0
    alpha_k: float = 0.1


def _train_sections() -> set[str]:
    try:
        from federation.config import SECTIONS

        return set(SECTIONS)
    except ImportError:
        return {"run", "data", "model", "strategy", "client", "fedprox", "amp", "fedsaf"}


def presets() -> list[Path]:
    """The training presets in ``configs/`` (the demo first); presets of other commands (prepare) are skipped."""
    if not PRESETS_DIR.is_dir():
        return []
    sections = _train_sections()
    found = []
    for path in sorted(PRESETS_DIR.glob("*.toml")):
        try:
            tables = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            continue
        if tables and set(tables) <= sections:
            found.append(path)
    return sorted(found, key=lambda p: (p != DEFAULT_PRESET, p.name))


def load_preset(path: Path | None) -> dict[str, Any]:
    """The engine's resolved configuration for a preset (defaults + the file) as a nested dict.

    Falls back to the file alone, then to ``{}``, so that the page still opens when the engine is unavailable.
    """
    try:
        from federation.config import load_config

        return load_config(path).to_dict()
    except (ImportError, ValueError):
        if path is not None and path.is_file():
            return tomllib.loads(path.read_text(encoding="utf-8"))
        return {}


def default_nhead(algorithm: str) -> int:
    """The strategy's own ``nhead`` when the configuration leaves it unset (engine registry)."""
    try:
        from federation.strategies import default_nhead as engine_default

        return engine_default(algorithm)
    except ImportError:
        return 6 if algorithm == "fedsaf" else 1 if algorithm == "fedrep" else 0


def defaults_from(preset: Mapping[str, Any]) -> FederationSettings:
    """Settings seeded from a resolved preset at ``CONFIG_KEYS``; keys it lacks keep the dataclass default."""
    values: dict[str, Any] = {}
    for item in fields(FederationSettings):
        section, key = CONFIG_KEYS[item.name]
        table = preset.get(section)
        if isinstance(table, Mapping) and key in table:
            values[item.name] = table[key]
    settings = replace(FederationSettings(), **values)
    if "nhead" not in values:
        settings = replace(settings, nhead=default_nhead(settings.algorithm))
    return settings


def validate(settings: FederationSettings, num_clients: int | None, num_units: int = DEFAULT_UNITS) -> list[str]:
    """Every reason the settings cannot run, as sentences that say what to change; empty when they are fine."""
    problems: list[str] = []
    s = settings
    if s.algorithm not in ALGORITHMS:
        problems.append(f"algorithm {s.algorithm!r} is unknown: choose one of {', '.join(ALGORITHMS)}.")
    if s.rounds < 1:
        problems.append(f"rounds = {s.rounds}: a federation needs at least 1 round.")
    if s.local_epochs < 1:
        problems.append(f"local epochs = {s.local_epochs}: each client must train at least 1 epoch per round.")
    if not (math.isfinite(s.lr) and s.lr > 0):
        problems.append(f"learning rate = {s.lr}: it must be a positive number (e.g. 0.01).")
    if num_clients is not None and num_clients < 2 and s.algorithm != "separate":
        problems.append(f"the dataset has {num_clients} hospital(s): a federation needs at least 2.")
    if s.algorithm in NHEAD_ALGORITHMS and not 0 <= s.nhead <= num_units:
        problems.append(
            f"nhead = {s.nhead}: the model has {num_units} layer units, so nhead must be between 0 "
            f"(share everything) and {num_units} (share nothing)."
        )
    if s.algorithm in AMP_ALGORITHMS:
        if s.dm not in DISTANCES:
            problems.append(f"distance {s.dm!r} is unknown: choose one of {', '.join(DISTANCES)}.")
        if not (math.isfinite(s.sigma) and s.sigma > 0):
            problems.append(f"sigma = {s.sigma}: it must be positive.")
        if not (math.isfinite(s.alpha_k) and s.alpha_k > 0):
            problems.append(f"alpha_k = {s.alpha_k}: it must be positive.")
        if not (math.isfinite(s.lam) and s.lam >= 0):
            problems.append(f"lambda = {s.lam}: it must be zero or positive.")
        if (
            num_clients is not None
            and num_clients >= 2
            and s.sigma > 0
            and s.alpha_k > 0
            and s.alpha_k * (num_clients - 1) > s.sigma
        ):
            most = s.sigma / (num_clients - 1)
            problems.append(
                f"alpha_k x (hospitals - 1) = {s.alpha_k:g} x {num_clients - 1} = {s.alpha_k * (num_clients - 1):g} "
                f"exceeds sigma = {s.sigma:g}, so a hospital's weight on its own model could turn negative: "
                f"lower alpha_k to at most {most:g} or raise sigma."
            )
    return problems


def engine_check(preset: Path | None, dataset: Path, settings: FederationSettings) -> str | None:
    """The engine's own configuration check (federation/config.py) on preset + overrides, as the CLI runs it.

    Returns its one-line error, or ``None`` when the configuration loads (or the engine is not installed).
    """
    try:
        from federation.config import load_config
    except ImportError:
        return None
    try:
        load_config(preset, overrides(settings), dataset)
    except ValueError as exc:  # FederationError, ModelError: user-facing, one line
        return str(exc)
    return None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return f'"{value}"'


def overrides(settings: FederationSettings) -> list[str]:
    """``section.key=value`` strings for ``gastric-fl train --set``; algorithm-specific keys only when they apply."""
    skip: set[str] = set()
    if settings.algorithm not in AMP_ALGORITHMS:
        skip |= {"dm", "lam", "sigma", "alpha_k"}
    if settings.algorithm not in NHEAD_ALGORITHMS:
        skip |= {"nhead"}
    if settings.algorithm not in FEDSAF_ONLY:
        skip |= {"fim", "split"}
    result = []
    for item in fields(FederationSettings):
        if item.name in skip:
            continue
        section, key = CONFIG_KEYS[item.name]
        result.append(f"{section}.{key}={_toml_value(getattr(settings, item.name))}")
    return result


def cli_prefix() -> list[str]:
    """How to call the ``gastric-fl`` CLI from the dashboard: the same interpreter, the same entry point."""
    return [sys.executable, "-m", "app.cli"]


def train_command(preset: Path | None, dataset: Path, run_dir: Path, settings: FederationSettings) -> list[str]:
    """The ``gastric-fl train`` command a person would type for these settings."""
    command = [*cli_prefix(), "train"]
    if preset is not None:
        command += ["--config", str(preset)]
    command += ["--data", str(dataset), "--out", str(run_dir)]
    for item in overrides(settings):
        command += ["--set", item]
    return command


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


def model_units(model_name: str) -> int:
    """How many layer units the model has (``models.split_units``), the upper bound of ``nhead``."""
    try:
        from models import create_model, split_units

        return len(split_units(create_model(model_name, 2)))
    except (ImportError, ValueError):
        return DEFAULT_UNITS


def new_run_id(algorithm: str, existing: set[str], now: float | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<algorithm>``, with ``-2``, ``-3`` ... appended if that folder already exists."""
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = f"{stamp}-{algorithm}"
    candidate, n = base, 1
    while candidate in existing:
        n += 1
        candidate = f"{base}-{n}"
    return candidate
