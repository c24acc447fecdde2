"""Each hospital's test and validation predictions of a run (``predictions.csv``, ``val_predictions.csv``) as the
dashboard, the verdict and the operating threshold read them, binary or of more classes (issue 51), beside
`app.run_records`, which reads the rest of a run directory. The files are read by `federation.runfiles`'s one reader
(`scan_predictions`); here they become pandas frames.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from app.errors import DashboardError
from app.evaluation.classes import ClassPredictions, prediction_classes, read_class_predictions
from app.run_records import load_summary
from federation import run_reader, runfiles
from federation.run_reader import RecordError
from federation.runfiles import hospital_files

# --- each hospital's predictions.csv ------------------------------------------------------------------------

PREDICTION_COLUMNS = runfiles.PREDICTION_COLUMNS[:4]  # the columns every binary predictions.csv has


def prediction_files(run: Path) -> list[Path]:
    """Each hospital's ``predictions.csv`` in a run made on this machine (``<run>/hospitals/client_XX/``).

    Per-tile probabilities never reach the server's part of a run; in a deployment they stay on each hospital's
    machine, and this page shows the hospitals whose folders are here.
    """
    return hospital_files(run, runfiles.PREDICTIONS_FILE)


_REDO = "the hospital rewrites it after each round; for a finished run, train the run again"


def read_prediction_file(path: Path) -> pd.DataFrame:
    """One hospital's ``predictions.csv`` (read by `federation.run_reader.read_predictions`) as a table: ``client``,
    ``path``, ``label`` 0 / 1, ``prob_abnormal`` in [0, 1] and, where the file says, the ``round`` it was written
    after.

    Anything else (missing, unreadable, columns missing, a label or probability that is not one, several clients,
    another task's predictions) is a one-line ``DashboardError`` naming the file and what to do.
    """
    try:
        found = run_reader.read_predictions(path)
    except RecordError as exc:
        if exc.kind == "missing":
            raise DashboardError(f"{path} does not exist: predictions are written after each round") from None
        if exc.kind == "other_task":
            raise DashboardError(f"{exc}: this page reads the normal / abnormal task only") from None
        raise DashboardError(f"{exc}; {_REDO}") from None
    columns: dict[str, Any] = {
        "client": pd.Series([found.hospital] * len(found.paths), dtype=int),
        "path": pd.Series(found.paths, dtype=object),
        "label": pd.Series(found.labels, dtype=int),
        "prob_abnormal": pd.Series(found.probs, dtype=float),
    }
    if found.round is not None:
        columns["round"] = pd.Series([found.round] * len(found.paths), dtype=int)
    return pd.DataFrame(columns)


@dataclass(frozen=True)
class RunPredictions:
    """Every hospital's predictions of a run that could be read, as one table, and one line per
    ``predictions.csv`` that could not."""

    frame: pd.DataFrame
    problems: tuple[str, ...]


def read_run_predictions(run: Path) -> RunPredictions:
    """Every hospital's ``predictions.csv`` that reads (columns client, path, label 0/1, prob_abnormal, ...); a
    damaged file is left out and named in ``problems``, so that the other hospitals are still shown."""
    frames: list[pd.DataFrame] = []
    problems: list[str] = []
    for path in prediction_files(run):
        try:
            frames.append(read_prediction_file(path))
        except DashboardError as exc:
            problems.append(str(exc))
    if not frames:
        empty = pd.DataFrame(
            {c: pd.Series(dtype=int if c in ("client", "label") else object) for c in PREDICTION_COLUMNS}
        )
        return RunPredictions(empty, tuple(problems))
    return RunPredictions(pd.concat(frames, ignore_index=True), tuple(problems))


def read_val_predictions(run: Path) -> pd.DataFrame | None:
    """Every hospital's ``val_predictions.csv`` that reads (same columns as the test predictions), or ``None`` when
    no hospital of the run has a validation split. A damaged file is left out: its hospital then chooses on test."""
    frames: list[pd.DataFrame] = []
    for path in hospital_files(run, runfiles.VAL_PREDICTIONS_FILE):
        with contextlib.suppress(DashboardError):
            frames.append(read_prediction_file(path))
    return pd.concat(frames, ignore_index=True) if frames else None


def hospital_rows(frame: pd.DataFrame | None, hospital: int) -> pd.DataFrame | None:
    """The rows of ``frame`` (predictions of several hospitals) that are ``hospital``'s, ``None`` when it has none."""
    if frame is None:
        return None
    rows = frame[frame["client"] == hospital]
    return rows if len(rows) else None


def load_predictions(run: Path) -> pd.DataFrame:
    """The hospitals' ``predictions.csv`` (client, path, label, prob_abnormal) with ``label`` as 0 / 1.

    Raises a one-line ``DashboardError`` when there is none yet (before round 1 ends) or one is malformed.
    """
    files = prediction_files(run)
    if not files:
        raise DashboardError(
            f"{run / runfiles.HOSPITALS_DIR} holds no predictions.csv yet: each is written after a round"
        )
    return pd.concat([read_prediction_file(path) for path in files], ignore_index=True)


# --- a run of more than two classes (issue 51) ---------------------------------------------------------------------


def run_classes(run: Path) -> tuple[str, ...]:
    """The classes of a run's model: ``summary.json``'s ``classes``, else the ``prob_<class>`` columns of its first
    ``predictions.csv`` (`app.evaluation.classes.prediction_classes`); empty while neither says (a run not started)."""
    named = load_summary(run).get("classes")
    if isinstance(named, list) and named:
        return tuple(str(c) for c in named)
    files = prediction_files(run)
    return prediction_classes(files[0]) if files else ()


@dataclass(frozen=True)
class RunClassPredictions:
    """Every hospital's multi-class ``predictions.csv`` that could be read (`app.evaluation.classes`), by hospital,
    and one line per file that could not."""

    hospitals: dict[int, ClassPredictions]
    problems: tuple[str, ...]


def read_run_class_predictions(run: Path) -> RunClassPredictions:
    """Each hospital's multi-class test predictions (`app.evaluation.classes.read_class_predictions`); a damaged
    file is left out and named in one line, so that the other hospitals are still shown."""
    found: dict[int, ClassPredictions] = {}
    problems: list[str] = []
    for path in prediction_files(run):
        try:
            read = read_class_predictions(path)
        except RecordError as exc:
            problems.append(f"{exc}; {_REDO}")
            continue
        found[runfiles.hospital_index(path.parent.name)] = read
    return RunClassPredictions(found, tuple(problems))
