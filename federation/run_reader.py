"""The one reader of a run directory (data/README.md section 3), for everything that reads a run after it was
written or while it grows: ``gastric-fl report`` and ``train`` (`federation.report`, ``app.cmd_train``), the HTML
report (``app.report_html.load``), the dashboard (``app.run_records``, with pandas frames on top) and
``report --amp-groups`` (`federation.amp_groups`).

- ``summary.json``: `read_summary` -> `RunSummary` (the object as written, with its fields typed);
- ``config.toml``: `read_config` -> `RunConfigFile` (its text and TOML tables; the validated ``RunConfig`` is
  ``federation.engine.load_run_config``'s, which imports the engine);
- ``metrics.jsonl``: `read_run_metrics` -> `federation.runfiles.MetricsRecords` (`federation.runfiles.read_metrics`);
- ``aggregation.jsonl``: `read_aggregation` -> `federation.jsonl.JsonlScan`;
- each hospital's ``predictions.csv`` and model card: `federation.runfiles.read_predictions`,
  `federation.runfiles.read_card_object` and `federation.runfiles.read_cards`, re-exported here.

Every reader raises one error type, `RecordError` (`infra.records`, re-exported here), whose ``kind`` says what is
wrong (``"missing"``, ``"unreadable"``, ``"malformed"``, ``"other_task"``), whose ``path`` names the file and whose
``cause`` is the error the file was read with; each command, report or page words it for its readers.

Standard library only (torch-free: the dashboard polls a live run with these readers).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.jsonl import JsonlScan, scan_jsonl
from federation.runfiles import (
    AGGREGATION_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    HospitalPredictions,
    MetricsRecords,
    left_out_lines,
    read_card_object,
    read_cards,
    read_metrics,
    read_predictions,
)
from infra.records import RecordError, read_json_object

__all__ = [
    "ENDED",
    "HospitalPredictions",
    "MetricsRecords",
    "RecordError",
    "RunConfigFile",
    "RunSummary",
    "read_aggregation",
    "read_card_object",
    "read_cards",
    "read_config",
    "read_predictions",
    "read_run_metrics",
    "read_summary",
]

ENDED = ("finished", "failed", "stopped")  # the statuses of a run whose process has stopped writing it


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunSummary:
    """A run's ``summary.json`` (``federation.server.summary``): ``data``, the object as written (empty while the
    run has written none), and its fields typed. ``present``: whether the file exists."""

    data: Mapping[str, Any] = field(default_factory=dict)
    present: bool = False

    @property
    def status(self) -> str | None:
        """``running``, ``finished``, ``failed`` or ``stopped`` (``None``: not written yet)."""
        value = self.data.get("status")
        return None if value is None else str(value)

    @property
    def ended(self) -> bool:
        """Whether the run's process has stopped writing it (finished, failed or stopped)."""
        return self.data.get("status") in ENDED

    @property
    def error(self) -> str | None:
        """Why the run failed, as the engine wrote it (``None`` when it says nothing)."""
        value = self.data.get("error")
        return str(value) if value else None

    @property
    def pid(self) -> int | None:
        """The process writing the run (``infra.pids``), when a whole number."""
        return _whole(self.data.get("pid"))

    @property
    def pid_started(self) -> int | None:
        """That process's start time, so that a reused pid is not taken for the run."""
        return _whole(self.data.get("pid_started"))

    @property
    def eta_seconds(self) -> float | None:
        """The engine's own estimate of the seconds left, when a finite number."""
        value = self.data.get("eta_seconds")
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return None

    @property
    def rounds_done(self) -> int | None:
        """Rounds finished so far, when a whole number."""
        return _whole(self.data.get("rounds_done"))

    @property
    def classes(self) -> tuple[str, ...]:
        """The dataset's class names (empty in a summary that names none)."""
        return tuple(str(c) for c in self.data.get("classes") or ())

    @property
    def final(self) -> Mapping[str, Any]:
        """The last complete round's figures (``federation.report.run_figures``; empty before one)."""
        value = self.data.get("final")
        return value if isinstance(value, Mapping) else {}

    @property
    def left_out(self) -> list[str]:
        """One line per hospital the run ended without (`federation.runfiles.left_out_lines`)."""
        return left_out_lines(self.data)


def read_summary(run: Path) -> RunSummary:
    """``<run>/summary.json`` as a `RunSummary` (an empty one while the file does not exist); `RecordError` when
    it cannot be read or is not JSON (``unreadable``) or holds no JSON object (``malformed``)."""
    path = run / SUMMARY_FILE
    if not path.is_file():
        return RunSummary()
    return RunSummary(read_json_object(path), present=True)


@dataclass(frozen=True)
class RunConfigFile:
    """A run's resolved ``config.toml`` (``federation.config``'s layout): ``path``, its ``text`` and its TOML
    ``tables`` (a plain dict, not a validated ``RunConfig``)."""

    path: Path
    text: str
    tables: dict[str, Any]

    def value(self, section: str, key: str) -> Any:
        """``tables[section][key]``, or ``None``."""
        table = self.tables.get(section)
        return table.get(key) if isinstance(table, Mapping) else None


def read_config(run: Path) -> RunConfigFile:
    """``<run>/config.toml`` as a `RunConfigFile`; `RecordError` for a missing file (``missing``) or one that
    cannot be read, is not UTF-8 or is not TOML (``unreadable``: ``cause`` says which)."""
    path = run / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
        tables = tomllib.loads(text)
    except FileNotFoundError as exc:
        raise RecordError(f"{path} does not exist", kind="missing", path=path, cause=exc) from None
    except tomllib.TOMLDecodeError as exc:
        raise RecordError(f"{path} is not valid TOML ({exc})", kind="unreadable", path=path, cause=exc) from None
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path} is not UTF-8 text", kind="unreadable", path=path, cause=exc) from None
    except OSError as exc:
        raise RecordError(
            f"{path} cannot be read ({exc.strerror or exc})", kind="unreadable", path=path, cause=exc
        ) from None
    return RunConfigFile(path, text, tables)


def read_run_metrics(run: Path) -> MetricsRecords:
    """``<run>/metrics.jsonl`` (`federation.runfiles.read_metrics`: the usable records, one per round and
    hospital, and a line per record left out); a missing file has none."""
    return read_metrics(run / METRICS_FILE)


def read_aggregation(run: Path) -> JsonlScan:
    """``<run>/aggregation.jsonl``: one record per round of what the strategy decided (``xi``, ``gamma``, ...),
    in file order, and its damaged lines (`federation.jsonl.scan_jsonl`); a missing file has none."""
    return scan_jsonl(run / AGGREGATION_FILE)
