"""Progress within a round: ``<run>/progress.json``, rewritten by the round loop, read by the dashboard.

``summary.json`` and ``metrics.jsonl`` change once per round, and a round of a real dataset takes minutes. The
round loop (``federation.server.loop``) rewrites this small file at each step of a round: the round, its phase
(``training``, ``aggregating``, ``evaluating``) and how many hospitals have answered out of how many were asked.
Hospitals are counted as they answer where the transport tells (the in-process engine one by one, worker
processes per batch); over Flower all hospitals of a phase answer at once.

The module imports nothing but the standard library, so the dashboard reads it without importing torch. The file
is replaced atomically (written beside as ``.progress.json.*``, then renamed), like every run file; a write that
fails (a full disk) is skipped, because progress must never stop a run.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from federation.runfiles import PROGRESS_FILE as PROGRESS_FILE  # named with the run's other files
from infra.outputs import write_atomic

PHASES = ("training", "aggregating", "evaluating")


@dataclass(frozen=True)
class RoundProgress:
    """Where the current round stands: ``hospitals_done`` of ``hospitals_total`` answered in ``phase``."""

    round: int
    rounds_total: int
    phase: str
    hospitals_done: int
    hospitals_total: int
    updated_at: float  # seconds since the epoch (time.time())


def write_progress(run_dir: Path, progress: RoundProgress) -> None:
    """Replace ``<run_dir>/progress.json`` atomically; an ``OSError`` is swallowed (progress is only a hint)."""
    if not run_dir.is_dir():  # progress never makes a run directory
        return
    with contextlib.suppress(OSError):
        write_atomic(run_dir / PROGRESS_FILE, json.dumps(asdict(progress)).encode("utf-8"))


def _count(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_progress(run_dir: Path) -> RoundProgress | None:
    """``progress.json`` of a run, or ``None`` when it is missing, unreadable or not in this layout."""
    try:
        data = json.loads((run_dir / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("phase") not in PHASES:
        return None
    counts = [_count(data, k) for k in ("round", "rounds_total", "hospitals_done", "hospitals_total")]
    updated = data.get("updated_at")
    if any(c is None for c in counts) or not isinstance(updated, int | float) or not math.isfinite(updated):
        return None
    server_round, total, done, asked = (int(c or 0) for c in counts)
    return RoundProgress(server_round, total, str(data["phase"]), min(done, asked), asked, float(updated))


def now() -> float:
    """The clock ``RoundProgress.updated_at`` uses."""
    return time.time()
