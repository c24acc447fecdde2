"""The Federation form's presets: the training presets in ``configs/``, a preset resolved over the engine's
defaults (``federation.config.DEFAULTS_TOML``), and the form's starting values taken from it. Nothing is
validated here (``checks`` does that) and nothing imports torch.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.dashboard.fields import FIELDS
from federation.config import DEFAULTS_TOML
from federation.methods import default_nhead
from models.names import DEFAULT_MODEL

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # where configs/ lives and where the dashboard's commands run
PRESETS_DIR = PROJECT_ROOT / "configs"
DEFAULT_PRESET = PRESETS_DIR / "demo.toml"


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
