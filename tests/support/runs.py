"""Reading a run's JSON-lines files in tests: every record, or every record without its wall times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOLATILE = frozenset({"seconds"})  # wall time differs between runs; everything else must not


def records(run_dir: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """Every record of ``run_dir / name``, in file order."""
    return [json.loads(line) for line in (run_dir / name).read_text(encoding="utf-8").splitlines()]


def stable(run_dir: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """The records of ``run_dir / name`` without their wall times (``VOLATILE``): what two runs must share."""
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in records(run_dir, name)]
