"""Reading the run directory's JSON-lines files (``metrics.jsonl``, ``aggregation.jsonl``; data/README.md section 3).

Plain ``json`` only (no torch), so that the dashboard can read a live run cheaply. Writers append whole lines, so
the only damage a healthy file can show is a torn *last* line (a writer mid-append, or a crash).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from federation.errors import FederationError


def read_jsonl(path: Path, *, damaged: Literal["skip", "raise"] = "skip") -> list[dict[str, Any]]:
    """The JSON objects of ``path``, in order; a missing file is empty and a torn last line is left out.

    ``damaged`` says what an unreadable line *before* the last one means: ``"skip"`` leaves it out (the engine:
    the round it belongs to is redone on resume), ``"raise"`` is a one-line ``FederationError`` naming the file and
    line (a reader that must not show half a history).
    """
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if damaged == "skip" or number == len(lines):
                continue
            raise FederationError(f"{path}, line {number}: not valid JSON ({exc.msg})") from exc
        if isinstance(value, dict):
            records.append(value)
    return records
