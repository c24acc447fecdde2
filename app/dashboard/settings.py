"""The names ``app/dashboard/compare.py`` imports from here: the demo dataset's name and commands, the presets'
folder and a method's default ``nhead``. The Federation form itself lives in ``fields`` (its settings),
``presets`` (the presets and starting values), ``checks`` (what refuses a run) and ``commands`` (the command
lines); import from those.
"""

from __future__ import annotations

from app.dashboard.commands import DEMO_NAME, demo_commands
from app.dashboard.presets import PRESETS_DIR
from federation.strategies.registry import default_nhead

__all__ = ["DEMO_NAME", "PRESETS_DIR", "default_nhead", "demo_commands"]
