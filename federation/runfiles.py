"""A run directory's layout and the torch-free readers of its files, in one place (data/README.md section 3).

Every name a run directory holds is defined here, and everything that writes, lists or reads a run (the engine,
the hospitals, ``gastric-fl report``, the ablation, the HTML report, the dashboard) takes it from here:

- the server's files: `CONFIG_FILE`, `METRICS_FILE` (one `MetricsLine` per round and hospital), `AGGREGATION_FILE`,
  `SUMMARY_FILE`, `AUDIT_FILE` (``run.audit``), `ANCHORS_FILE`, `PROGRESS_FILE`, `CHECKPOINT_DIR`;
- what ``gastric-fl report`` writes into a run (`REPORT_DIR`, `REPORT_FILES`, ``--amp-groups``'s `AMP_GROUPS_MD`);
- each in-process hospital's folder ``<run>/hospitals/client_XX/`` (two digits: the hospital's index in the
  federation; a deployed hospital's kit and folder carry the same name): `hospital_dir`, `HOSPITAL_GLOB`
  (``client_[0-9][0-9]``), `hospital_name` (``infra.formats``': a prepared dataset's hospital folders carry the
  same name), `hospital_index`, `hospital_files`; and what a hospital keeps there
  (`HOSPITAL_FILE`, `PREDICTIONS_FILE` with `PREDICTION_COLUMNS`, `OUTBOUND_FILE`, `ACCOUNTANT_FILE`,
  the exported model's files (`models.names.WEIGHTS_FILE` and `CARD_FILE`, named there), and `SLIDES_DIR`);
- one reader of a hospital's ``predictions.csv`` (`read_predictions`), whose errors name the file and line, and
  one of ``metrics.jsonl`` (`read_metrics`) and one of the hospitals' model cards (`read_card_object`,
  `read_cards`), which ``gastric-fl report``, the HTML report and the dashboard share (through
  `federation.run_reader`, which adds ``summary.json``, ``config.toml`` and ``aggregation.jsonl``). Their one
  error type is `infra.records.RecordError` (named `PredictionsError` and `CardError` here), with its ``kind``.

Standard library only, so that the readers of run files (the dashboard polls a live run) do not wait for torch.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from federation.jsonl import DamagedLine, scan_jsonl
from infra.formats import BINARY_CLASSES, HOSPITAL_PREFIX, hospital_name
from infra.records import RecordError, read_json_object
from models.names import CARD_FILE

# -- the server's files ---------------------------------------------------------------------------------------------
CONFIG_FILE = "config.toml"  # the resolved configuration (federation.config)
METRICS_FILE = "metrics.jsonl"  # one MetricsLine per round x evaluated hospital
AGGREGATION_FILE = "aggregation.jsonl"  # one line per round: what the strategy decided (xi, gamma, ...)
SUMMARY_FILE = "summary.json"  # running / finished / failed / stopped, and the run's figures
AUDIT_FILE = "messages.jsonl"  # what crossed the hospital boundary (run.audit; federation.server.audit)
ANCHORS_FILE = "anchors.json"  # each hospital's outbound-log head as its latest reply carried it (engine.audit)
PROGRESS_FILE = "progress.json"  # the round under way, for the dashboard's progress bar (federation.progress)
CHECKPOINT_DIR = "checkpoints"  # the server's per-round checkpoints; a hospital's own, in its folder

# -- what `gastric-fl report` writes (into the run, or into REPORT_DIR beside it) -----------------------------------
REPORT_DIR = "report"
REPORT_MD = "report.md"
REPORT_CSV = "report.csv"
HOSPITALS_CSV = "hospitals.csv"
ACCURACY_PNG = "accuracy.png"
AMP_GROUPS_MD = "amp_groups.md"  # gastric-fl report --amp-groups (federation.amp_groups)
REPORT_FILES = (REPORT_MD, REPORT_CSV, HOSPITALS_CSV, ACCURACY_PNG, AMP_GROUPS_MD)

# -- a hospital's folder ---------------------------------------------------------------------------------------------
HOSPITALS_DIR = "hospitals"
HOSPITAL_GLOB = f"{HOSPITAL_PREFIX}[0-9][0-9]"
HOSPITAL_FILE = "hospital.json"  # the hospital's own record of the run (federation.hospital.handler)
PREDICTIONS_FILE = "predictions.csv"  # its test tiles' probabilities, rewritten after each round
# its validation tiles' probabilities (same columns), rewritten after each round: where thresholds are chosen
VAL_PREDICTIONS_FILE = "val_predictions.csv"
# its held-out test slides scored as `gastric-fl predict` scores them, after the last round (app.held_out)
SLIDES_FILE = "slides.csv"
OUTBOUND_FILE = "outbound.jsonl"  # what left the hospital (federation.hospital.outbound)
ACCOUNTANT_FILE = "privacy.json"  # its differential-privacy ledger (federation.hospital.privacy)
REPORT_HTML = "report.html"  # gastric-fl report --html (app.report_html)
SLIDES_DIR = "slides"  # slides scored with the hospital's model (app.slide_view)
PREDICTION_COLUMNS = ("client", "path", "label", "prob_abnormal", "round")


class MetricsLine(TypedDict):
    """One line of ``metrics.jsonl``: one hospital's round (``federation.server.rounds.RoundRecord.metrics_lines``).

    Losses, accuracy, AUC and the Fisher trace are ``None`` where not finite or not measured (JSON has no NaN);
    ``values_sent`` / ``values_received`` count the tensor values that crossed the boundary for this hospital;
    ``trained``: whether its training reply was used this round (else it was only evaluated); ``num_train``: the
    training tiles it declared when it was (0 when not: nothing of a left-out reply is recorded). The
    differential-privacy fields appear only in runs with ``[privacy]`` (federation.hospital.privacy).
    """

    round: int
    client: int
    train_loss: float | None
    test_loss: float | None
    test_acc: float | None
    test_auc: float | None
    fisher_trace: float | None
    values_sent: int
    values_received: int
    seconds: float
    num_train: int
    num_test: int
    trained: bool
    dp_epsilon: NotRequired[float | None]
    dp_delta: NotRequired[float | None]
    dp_steps: NotRequired[float | None]


def hospital_dir(run: Path, hospital: int) -> Path:
    """``<run>/hospitals/client_XX``: hospital ``hospital``'s folder in a run directory."""
    return run / HOSPITALS_DIR / hospital_name(hospital)


def hospital_index(name: str) -> int:
    """The hospital index a ``client_XX`` folder name carries (``ValueError`` for another name)."""
    if not name.startswith(HOSPITAL_PREFIX):
        raise ValueError(f"{name!r} is not a hospital folder name (client_XX)")
    return int(name.removeprefix(HOSPITAL_PREFIX))


def hospital_files(run: Path, name: str) -> list[Path]:
    """``<run>/hospitals/client_XX/<name>`` for every hospital folder of ``run`` that holds it, by index."""
    return sorted((run / HOSPITALS_DIR).glob(f"{HOSPITAL_GLOB}/{name}"))


def prediction_columns(classes: Sequence[str]) -> tuple[str, ...]:
    """``predictions.csv``'s columns for a dataset's ``classes``: ``PREDICTION_COLUMNS`` for the binary task
    (``normal``, ``abnormal``); otherwise ``client, path, label``, ``prob_<class>`` per class in class-index
    order, ``round``."""
    if tuple(classes) == BINARY_CLASSES:
        return PREDICTION_COLUMNS
    return ("client", "path", "label", *(f"prob_{c}" for c in classes), "round")


# A predictions.csv or model card that cannot be used: the one error type of the run directory's readers
# (infra.records.RecordError), under the names its readers have always caught. ``kind``: "missing", "unreadable"
# (the file cannot be read as CSV / JSON), "malformed" (it reads, but a column, value or the object is wrong) or, for
# predictions.csv, "other_task" (another task's predictions); ``damaged``: unreadable or malformed.
PredictionsError = RecordError
CardError = RecordError


@dataclass(frozen=True)
class HospitalPredictions:
    """One hospital's ``predictions.csv`` (binary task): per test tile its dataset-relative path, label (1 =
    abnormal) and P(abnormal), the hospital index and the round the file was written after (``None``: not said)."""

    hospital: int | None
    paths: tuple[str, ...]
    labels: tuple[int, ...]
    probs: tuple[float, ...]
    round: int | None


_NUMBERS = ("train_loss", "test_loss", "test_acc", "test_auc", "fisher_trace", "seconds")
_COUNTS = ("values_sent", "values_received", "num_train", "num_test")


def metrics_problem(record: Mapping[str, Any]) -> str | None:
    """Why one ``metrics.jsonl`` record cannot be used (``None`` if it can): a round or client that is not a
    whole number, a metric that is neither a number nor null, a count that is not a whole number."""
    for key in ("round", "client"):
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{key} is {value!r}, not a whole number"
    for key in _NUMBERS:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"{key} is {value!r}, not a number or null"
    for key in _COUNTS:
        value = record.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key} is {value!r}, not a whole number"
    return None


@dataclass(frozen=True)
class MetricsRecords:
    """``metrics.jsonl`` as every reader uses it (`read_metrics`).

    ``records``: the usable records in file order, one per round and hospital (where a round and hospital appear
    twice, the last one written counts: a resumed run's record replaces the earlier one); ``damaged``: lines that
    are not JSON objects; ``problems``: one line per record left out, damaged, malformed or replaced, naming the
    file and line.
    """

    records: list[dict[str, Any]]
    damaged: tuple[DamagedLine, ...]
    problems: list[str]


def read_metrics(path: Path) -> MetricsRecords:
    """Read ``path`` (a run's ``metrics.jsonl``; missing: no records) into `MetricsRecords`.

    The one reader of the file: ``gastric-fl report`` (`federation.report.load_run`), the HTML report and the
    dashboard's frames all take their records from here, so they leave out the same records."""
    scan = scan_jsonl(path)
    problems = [f"{bad}; the record is left out" for bad in scan.damaged]
    kept: dict[tuple[int, int], tuple[int, dict[str, Any]]] = {}
    for i, (record, line) in enumerate(zip(scan.records, scan.lines, strict=True)):
        problem = metrics_problem(record)
        if problem is not None:
            problems.append(f"{path}, line {line}: {problem}; the record is left out")
            continue
        key = (int(record["round"]), int(record["client"]))
        if key in kept:
            problems.append(
                f"{path}, line {line}: round {key[0]} of hospital {key[1]} is written again; "
                "the earlier record is left out"
            )
        kept[key] = (i, record)
    records = [record for _, record in sorted(kept.values(), key=lambda item: item[0])]
    return MetricsRecords(records, scan.damaged, problems)


_LABEL_VALUES = {"normal": 0, "abnormal": 1, "0": 0, "1": 1}


def _number(text: str | None) -> float:
    value = float(str(text).strip())
    if not math.isfinite(value):
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class PredictionRows:
    """The rows of one hospital's ``predictions.csv`` as `scan_predictions` reads them: per tile its path, label
    index and probabilities (one per probability column), the hospital index and the last round said (or ``None``)."""

    hospital: int | None
    paths: tuple[str, ...]
    labels: tuple[int, ...]
    probs: tuple[tuple[float, ...], ...]
    round: int | None


def scan_predictions(path: Path, columns: Sequence[str], labels: Mapping[str, int], label_rule: str) -> PredictionRows:
    """The one reader of a hospital's ``predictions.csv`` (``client, path, label``, the probability ``columns``,
    optionally ``round``), for the binary task (`read_predictions`) and a model of more classes
    (`app.evaluation.classes.read_class_predictions`): each label mapped by ``labels`` (``label_rule`` says what is
    allowed), every number finite, every probability in [0, 1], one hospital; `PredictionsError` naming the file
    (and line) for a missing, unreadable or malformed file. The caller checks which columns the file holds first."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            present = list(reader.fieldnames or ())
            missing = [c for c in ("client", "path", "label", *columns) if c not in present]
            if missing:
                raise PredictionsError(f"{path} lacks the column(s) {', '.join(missing)}", kind="malformed", path=path)
            named = " and ".join(("client", *columns)) if len(columns) == 1 else "client and every prob_ column"
            hospitals: set[int] = set()
            paths: list[str] = []
            label_list: list[int] = []
            probs: list[tuple[float, ...]] = []
            rounds: list[int] = []
            for number, row in enumerate(reader, start=2):
                where = f"{path}, line {number}"
                label = labels.get(str(row.get("label") or "").strip())
                if label is None:
                    raise PredictionsError(f"{where}: label must be {label_rule}", kind="malformed", path=path)
                try:
                    values = tuple(_number(row.get(c)) for c in columns)
                    hospital = _number(row.get("client"))
                except (TypeError, ValueError):
                    raise PredictionsError(f"{where}: {named} must be numbers", kind="malformed", path=path) from None
                if not all(0.0 <= v <= 1.0 for v in values) or hospital != int(hospital):
                    between = f"{columns[0]} must be" if len(columns) == 1 else "probabilities must be"
                    raise PredictionsError(
                        f"{where}: {between} between 0 and 1 and client a hospital number", kind="malformed", path=path
                    )
                hospitals.add(int(hospital))
                paths.append(str(row.get("path") or ""))
                label_list.append(label)
                probs.append(values)
                if row.get("round"):
                    try:
                        rounds.append(int(_number(row["round"])))
                    except ValueError:
                        raise PredictionsError(
                            f"{where}: round must be a number", kind="malformed", path=path
                        ) from None
    except FileNotFoundError as exc:
        raise PredictionsError(f"{path} does not exist", kind="missing", path=path, cause=exc) from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PredictionsError(f"{path} cannot be read ({exc})", kind="unreadable", path=path, cause=exc) from None
    if len(hospitals) > 1:
        raise PredictionsError(
            f"{path}: client must be one hospital number, found {sorted(hospitals)}", kind="malformed", path=path
        )
    return PredictionRows(
        next(iter(hospitals), None), tuple(paths), tuple(label_list), tuple(probs), max(rounds) if rounds else None
    )


def prediction_classes(path: Path) -> tuple[str, ...]:
    """The classes a ``predictions.csv`` holds probabilities for (its ``prob_<class>`` columns, in order); empty when
    the file is missing or unreadable (its reader says why)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            columns = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return ()
    return tuple(c.removeprefix("prob_") for c in columns if c.startswith("prob_"))


def read_predictions(path: Path) -> HospitalPredictions:
    """A hospital's ``predictions.csv`` (``client, path, label, prob_abnormal[, round]``; label ``normal`` /
    ``abnormal`` or 0 / 1) as `HospitalPredictions`; `PredictionsError` naming the file (and line) for a missing,
    multi-class or damaged file, or one holding several hospitals (`scan_predictions`)."""
    classes = prediction_classes(path)
    if classes and "abnormal" not in classes:
        raise PredictionsError(
            f"{path} holds a {len(classes)}-class model's predictions ({', '.join(classes)}), not the "
            "normal / abnormal task",
            kind="other_task",
            path=path,
        )
    rows = scan_predictions(path, ("prob_abnormal",), _LABEL_VALUES, "normal/abnormal or 0/1")
    return HospitalPredictions(
        hospital=rows.hospital,
        paths=rows.paths,
        labels=rows.labels,
        probs=tuple(p for (p,) in rows.probs),
        round=rows.round,
    )


def read_card_object(path: Path) -> dict[str, Any]:
    """A hospital's model card (``path``: its ``model.json``) as a JSON object, without loading the weights (no
    torch); `CardError` naming the file for a missing, unreadable (not JSON, or not readable) or malformed (not an
    object) card (`infra.records.read_json_object`). Its fields are checked by ``models.bundle.ModelCard`` where a
    model is loaded."""
    return read_json_object(path)


def read_cards(run: Path) -> dict[int, dict[str, Any]]:
    """Each hospital's model card of ``run`` that reads as a JSON object (`read_card_object`), by hospital index;
    a missing or unreadable card leaves its hospital out (the pages and reports name such hospitals themselves)."""
    found: dict[int, dict[str, Any]] = {}
    for path in hospital_files(run, CARD_FILE):
        try:
            found[hospital_index(path.parent.name)] = read_card_object(path)
        except CardError:
            continue
    return found


def left_out_lines(summary: Mapping[str, Any]) -> list[str]:
    """One line per hospital the run ended without, from its ``summary.json``: left out of the last round written
    (``left_out``: hospital, round, reason, as the round loop recorded them, and whether it still evaluated that
    round, so that its exported model is that round's) or of the whole run at its Hello (``left_out_at_hello``).
    Empty for a run every hospital finished. ``gastric-fl train`` prints them last and then exits 3
    (docs/reliability.md): such a run is not a clean finish."""
    lines = []
    for who, why in sorted((summary.get("left_out_at_hello") or {}).items()):
        lines.append(f"hospital {who} was left out of the whole run at its hello: {why}")
    for entry in summary.get("left_out") or []:
        if not isinstance(entry, Mapping):
            continue
        who, at = entry.get("hospital"), entry.get("round")
        # the hospital's own reasons start with its name: said once here
        why = re.sub(rf"(^|; |evaluation: )hospital {who}: ", r"\1", str(entry.get("reason", "")))
        model = (
            f"it did not train in round {at}, but evaluated and exported round {at}'s model"
            if entry.get("evaluated") is True
            else f"its exported model (model.json) is not of round {at}"
        )
        lines.append(
            f"hospital {who} was left out of round {at}, the run's last: {why}; {model}: fix the cause, then "
            "continue with gastric-fl train --resume"
        )
    return lines
