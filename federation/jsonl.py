"""Reading the run directory's JSON-lines files (``metrics.jsonl``, ``aggregation.jsonl``; data/README.md section 3).

Plain ``json`` only (no torch), so that the dashboard can read a live run cheaply. Writers append whole lines, so
the only damage a healthy file can show is a torn *last* line (a writer mid-append, or a crash).

`scan_jsonl` reads a file and names every damaged line by file and line number (`DamagedLine`), so that a reader
can say what it left out; `read_jsonl` is the short form for readers that only want the records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from federation.errors import FederationError


@dataclass(frozen=True)
class DamagedLine:
    """A line of a JSON-lines file that holds no JSON object: where it is and why it was left out."""

    path: Path
    line: int
    reason: str
    last: bool  # the file's last line with no newline after it: torn by a writer mid-append or by a crash

    def __str__(self) -> str:
        return f"{self.path}, line {self.line}: {self.reason}"


@dataclass(frozen=True)
class JsonlScan:
    """The JSON objects of a file, in order, the line each was read from, and the lines that could not be read."""

    records: list[dict[str, Any]]
    damaged: tuple[DamagedLine, ...]
    lines: tuple[int, ...]  # lines[i]: the 1-based line of records[i]


def scan_jsonl(path: Path) -> JsonlScan:
    """Every JSON object of ``path`` and every damaged line (not JSON, cut off, not an object); missing = empty."""
    if not path.is_file():
        return JsonlScan([], (), ())
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")  # a complete file ends with a newline, so its final element is empty
    records: list[dict[str, Any]] = []
    numbers: list[int] = []
    damaged: list[DamagedLine] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            torn = number == len(lines)
            reason = "cut off (not valid JSON)" if torn else f"not valid JSON ({exc.msg})"
            damaged.append(DamagedLine(path, number, reason, torn))
            continue
        if not isinstance(value, dict):
            damaged.append(DamagedLine(path, number, "not a JSON object", number == len(lines)))
            continue
        records.append(value)
        numbers.append(number)
    return JsonlScan(records, tuple(damaged), tuple(numbers))


def read_jsonl(path: Path, *, damaged: Literal["skip", "raise"] = "skip") -> list[dict[str, Any]]:
    """The JSON objects of ``path``, in order; a missing file is empty and a torn last line is left out.

    ``damaged`` says what an unreadable line *before* the last one means: ``"skip"`` leaves it out (the engine:
    the round it belongs to is redone on resume), ``"raise"`` is a one-line ``FederationError`` naming the file and
    line (a reader that must not show half a history). Use `scan_jsonl` to report what was left out.
    """
    scan = scan_jsonl(path)
    if damaged == "raise":
        for bad in scan.damaged:
            if not bad.last:
                raise FederationError(str(bad))
    return scan.records
