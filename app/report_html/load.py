"""Reading one hospital of a run for its HTML report: everything the report shows, read before any HTML is built.

From the files the hospital owns (``<run>/hospitals/client_XX/``: ``predictions.csv`` and ``val_predictions.csv``, the
model card ``model.json``, the held-out slides ``slides.csv``) and the run's ``config.toml``, ``summary.json`` and
``metrics.jsonl`` (the engine's own last-round figures): `load_hospital` returns a `HospitalReport`, and anything
unusable (a run or hospital that does not exist, a damaged ``predictions.csv``, ``model.json`` or ``config.toml``) is a
`ReportError`, one line that says what to do. A hospital whose model tells more than two classes (its card's
``class_names``, else its ``predictions.csv``'s ``prob_<class>`` columns) is read by `load_classes` into a `ClassReport`
instead (`app.evaluation.classes`); `load_report` reads either. Damaged ``metrics.jsonl`` records, an unreadable
validation split or ``slides.csv`` only become notes in the report. `_config_dataset` finds the prepared dataset the
run's ``config.toml`` names, for the page's tiles and for scoring. docs/dashboard.md ("The hospital's report:
`gastric-fl report --html`") describes the inputs; this module sits at the bottom of the package (docs/design.md,
"Layout and layers") and imports no other part of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.evaluation.classes import ClassPredictions, is_multi_class, prediction_classes, read_class_predictions
from app.held_out import SlideCallsError, as_slides, read_slide_calls
from federation import run_reader
from federation.run_reader import RecordError, read_card_object, read_config, read_run_metrics, read_summary
from federation.runfiles import (
    PREDICTIONS_FILE,
    SLIDES_FILE,
    VAL_PREDICTIONS_FILE,
    hospital_dir,
    hospital_files,
    hospital_index,
)
from infra.formats import BINARY_CLASSES, HOSPITAL_PREFIX
from infra.records import read_json_object
from models.card_history import THRESHOLD_DEFAULT_SOURCE, history_problem
from models.decision import Slides
from models.names import CARD_FILE

CLASS_NAMES = BINARY_CLASSES


class ReportError(ValueError):
    """A run or hospital the HTML report cannot be made from; the CLI prints it as one line and exits 2."""

    user_facing = True


def hospital_folders(run: Path) -> dict[int, Path]:
    """Hospital index -> folder, for each hospital of ``run`` with a ``predictions.csv``."""
    return {hospital_index(p.parent.name): p.parent for p in hospital_files(run, PREDICTIONS_FILE)}


def _hospital_index(hospital: int | str) -> int:
    if isinstance(hospital, int):
        return hospital
    text = str(hospital).removeprefix(HOSPITAL_PREFIX)
    if not text.isdigit():
        raise ReportError(f"hospital {hospital!r}: give its number (0, 1, ...) or its folder name (client_00)")
    return int(text)


@dataclass(frozen=True)
class Predictions:
    """A hospital's test tiles: dataset-relative paths, labels (1 abnormal) and P(abnormal)."""

    paths: tuple[str, ...]
    labels: npt.NDArray[np.int64]
    probs: npt.NDArray[np.float64]
    round: int | None


def read_predictions(path: Path) -> Predictions:
    """A hospital's ``predictions.csv`` read by `federation.run_reader.read_predictions`, as arrays; `ReportError`
    naming the file (and line) and what to do if it is missing, damaged, made for another task or empty."""
    try:
        found = run_reader.read_predictions(path)
    except RecordError as exc:
        if exc.kind == "missing":
            raise ReportError(f"{path} does not exist: the hospital has no test predictions yet") from None
        if exc.kind == "other_task":
            raise ReportError(
                f"{exc}: the HTML report's verdict, ROC, sensitivity and slide calls are binary notions, not "
                "applicable to this run; gastric-fl report without --html gives its accuracy per hospital"
            ) from None
        raise ReportError(f"{exc}; rerun the run to write the file anew") from None
    if not found.paths:
        raise ReportError(f"{path} holds no test tiles; the hospital's test split is empty")
    return Predictions(
        found.paths, np.asarray(found.labels, dtype=np.int64), np.asarray(found.probs, np.float64), found.round
    )


def _json_file(path: Path, what: str) -> dict[str, Any]:
    """The JSON object ``path`` holds (a hospital's ``hospital.json``: ``app.report_html.page``), ``{}`` while it
    does not exist; `ReportError` naming the file, what is wrong (`infra.records.read_json_object`) and ``what``
    to do when it is unreadable or holds no object."""
    if not path.is_file():
        return {}
    try:
        return read_json_object(path)
    except RecordError as exc:
        raise ReportError(f"{exc}; {what}") from None


@dataclass
class RunHospital:
    """What every report of one hospital reads first (`_open_run`, `_summary`, `_card`): the run, the hospital's
    index and folder, the run's configuration (text and tables) and summary, and the hospital's model card."""

    run: Path
    hospital: int
    folder: Path
    config_text: str
    config: dict[str, Any]
    summary: dict[str, Any]
    card: dict[str, Any]


@dataclass
class HospitalReport(RunHospital):
    """Everything one hospital's report shows, read and computed before any HTML is written."""

    predictions: Predictions
    threshold: float
    engine: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # the hospital's validation predictions, where its thresholds are chosen (None: it has no validation split)
    val_predictions: Predictions | None = None
    # its held-out test slides as predict scored them (slides.csv, app.held_out; None: not scored on this machine)
    held_out: Slides | None = None


def _open_run(run: Path, hospital: int) -> tuple[str, dict[str, Any], Path]:
    """``run``'s ``config.toml`` (its text and tables) and hospital ``client``'s folder; `ReportError` when the run
    or the hospital is not there or the configuration does not read."""
    if not run.is_dir():
        raise ReportError(f"run directory {run} does not exist: give a folder made by gastric-fl train")
    try:
        config_file = read_config(run)
    except RecordError as exc:
        if exc.kind == "missing":
            raise ReportError(
                f"{run} is not a run directory (no config.toml): give a folder made by gastric-fl train"
            ) from None
        raise ReportError(
            f"{exc.path} is not valid TOML ({exc.cause}); restore it (each hospital.json keeps a copy as config_toml)"
        ) from None
    folder = hospital_dir(run, hospital)
    if not folder.is_dir():
        known = ", ".join(str(c) for c in hospital_folders(run)) or "none"
        raise ReportError(f"{folder} does not exist: hospital {hospital} is not part of this run (hospitals: {known})")
    return config_file.text, config_file.tables, folder


def _summary(run: Path) -> dict[str, Any]:
    try:
        return dict(read_summary(run).data)
    except RecordError as exc:
        raise ReportError(f"{exc}; the run rewrites it at the next round; rerun or resume the run") from None


def _card(folder: Path) -> dict[str, Any]:
    """The hospital's model card, ``{}`` for a run made before model export; `ReportError` when damaged."""
    try:
        return read_card_object(folder / CARD_FILE)
    except RecordError as exc:
        if exc.kind != "missing":
            raise ReportError(f"{exc}; train the run again (or resume it) to export the model anew") from None
        return {}


def load_hospital(run: Path, hospital: int | str) -> HospitalReport:
    """Read what the report of ``hospital`` in ``run`` needs; `ReportError` (one line) for anything unusable."""
    index = _hospital_index(hospital)
    config_text, config, folder = _open_run(run, index)
    predictions = read_predictions(folder / PREDICTIONS_FILE)
    summary = _summary(run)
    card = _card(folder)  # a run made before model export: noted below
    notes: list[str] = []
    threshold = 0.5
    classes = card.get("class_names") or list(CLASS_NAMES)
    if card and (len(classes) != 2 or card.get("positive_class", "abnormal") not in classes):
        raise ReportError(
            f"{folder / CARD_FILE}: the model tells {len(classes)} classes; its report is the multi-class one "
            "(load_report reads it)"
        )
    if card:
        value = card.get("threshold")
        if not isinstance(value, int | float) or not 0.0 < float(value) < 1.0:
            raise ReportError(f"{folder / CARD_FILE}: threshold {value!r} is not in (0, 1); export again")
        threshold = float(value)
        # the threshold is reported only as the card's history describes it (predict refuses such a card too)
        problem = history_problem(
            threshold,
            str(card.get("threshold_source") or THRESHOLD_DEFAULT_SOURCE),
            str(card.get("threshold_split") or ""),
            card.get("threshold_history"),
        )
        if problem is not None:
            raise ReportError(f"{folder / CARD_FILE}: {problem}")
    else:
        notes.append(f"{folder / CARD_FILE} is missing (a run made before model export): threshold 0.5.")
    metrics = read_run_metrics(run)
    notes += [f"{problem}." for problem in metrics.problems]
    mine = [r for r in metrics.records if r["client"] == index]
    engine = max(mine, key=lambda r: int(r["round"])) if mine else {}
    val_predictions = None
    if (folder / VAL_PREDICTIONS_FILE).is_file():
        try:
            val_predictions = read_predictions(folder / VAL_PREDICTIONS_FILE)
        except RecordError as exc:
            notes.append(f"{exc}; thresholds are chosen on the test split instead (optimistic).")
    held_out = None
    if (folder / SLIDES_FILE).is_file():
        try:
            held_out = as_slides(read_slide_calls(folder / SLIDES_FILE))
        except SlideCallsError as exc:
            notes.append(f"{exc}; the slide figures are grouped from the test tiles instead.")
    return HospitalReport(
        run,
        index,
        folder,
        config_text,
        config,
        summary,
        card,
        predictions,
        threshold,
        engine,
        notes,
        val_predictions,
        held_out,
    )


@dataclass
class ClassReport(RunHospital):
    """Everything the report of one hospital of a multi-class run shows (`app.evaluation.classes`): its test
    predictions, and its records of ``metrics.jsonl`` by round (the round curves; the last one is the engine's own
    figures)."""

    predictions: ClassPredictions
    rounds: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def engine(self) -> dict[str, Any]:
        """The hospital's last recorded round in ``metrics.jsonl`` (``{}``: none)."""
        return self.rounds[-1] if self.rounds else {}


def load_classes(run: Path, hospital: int | str) -> ClassReport:
    """Read what the report of ``hospital`` of a multi-class ``run`` needs (its ``predictions.csv`` with one
    ``prob_<class>`` column per class); `ReportError` (one line) for anything unusable."""
    hospital = _hospital_index(hospital)
    config_text, config, folder = _open_run(run, hospital)
    path = folder / PREDICTIONS_FILE
    card = _card(folder)
    named = card.get("class_names")
    found = prediction_classes(path)
    if isinstance(named, list) and found and [str(c) for c in named] != list(found):
        raise ReportError(
            f"{folder / CARD_FILE} tells {len(named)} classes ({', '.join(map(str, named))}) but {path} holds "
            f"probabilities of {', '.join(found)}; rerun the run to write both anew"
        )
    try:
        predictions = read_class_predictions(path)
    except RecordError as exc:
        if exc.kind == "missing":
            raise ReportError(f"{path} does not exist: the hospital has no test predictions yet") from None
        raise ReportError(f"{exc}; rerun the run to write the file anew") from None
    if not predictions.paths:
        raise ReportError(f"{path} holds no test tiles; the hospital's test split is empty")
    summary = _summary(run)
    notes = [] if card else [f"{folder / CARD_FILE} is missing (a run made before model export)."]
    metrics = read_run_metrics(run)
    notes += [f"{problem}." for problem in metrics.problems]
    rounds = sorted((r for r in metrics.records if r["client"] == hospital), key=lambda r: int(r["round"]))
    return ClassReport(run, hospital, folder, config_text, config, summary, card, predictions, rounds, notes)


def report_classes(folder: Path) -> tuple[str, ...]:
    """The classes of a hospital's model: its card's ``class_names``, else the ``prob_<class>`` columns of its
    ``predictions.csv`` (the binary task's when neither says)."""
    try:
        named = read_card_object(folder / CARD_FILE).get("class_names")
    except RecordError:
        named = None
    if isinstance(named, list) and named:
        return tuple(str(c) for c in named)
    return prediction_classes(folder / PREDICTIONS_FILE) or tuple(CLASS_NAMES)


def load_report(run: Path, hospital: int | str) -> HospitalReport | ClassReport:
    """The report of ``hospital`` in ``run``: `load_classes` for a model of more than two classes (its card or its
    predictions say so), `load_hospital` otherwise."""
    folder = hospital_dir(run, _hospital_index(hospital))
    if is_multi_class(report_classes(folder)):
        return load_classes(run, hospital)
    return load_hospital(run, hospital)


def _config_dataset(rep: HospitalReport | ClassReport) -> Path | None:
    value = (rep.config.get("data") or {}).get("path")
    if not isinstance(value, str) or not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = next((b / path for b in (Path.cwd(), *rep.run.resolve().parents) if (b / path).is_dir()), path)
    return path if path.is_dir() else None
