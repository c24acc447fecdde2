"""Reading prepared datasets (data/README.md section 2) for the Data page: counts, flags and sample tiles.

Everything here is plain pandas/PIL so it is testable without Streamlit. Counts come from ``manifest.csv``
(one row per tile), the ground truth that ``federation`` also reads; ``prepare.json`` adds the configuration.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from PIL import Image

from app.errors import DashboardError
from infra.formats import MANIFEST_FILE, PREPARE_RECORD
from infra.records import RecordError, read_prepare_record
from pipeline.config import LABELS
from pipeline.prepare_records import MANIFEST_COLUMNS
from pipeline.report import SPLITS as PREPARED_SPLITS

SPLITS = PREPARED_SPLITS  # train, val, test (pipeline.report)


def hospital_label(hospital: int) -> str:
    """How a client index is shown: 0-based like the ``client_XX`` folders, so files and screen agree."""
    return f"Hospital {int(hospital)}"


@dataclass(frozen=True)
class PreparedDataset:
    """One folder under ``prepared/`` that holds a ``manifest.csv``."""

    name: str
    path: Path


def list_datasets(prepared: Path) -> list[PreparedDataset]:
    """Prepared datasets under ``prepared``, by name; folders without a manifest (e.g. half-written) are skipped."""
    if not prepared.is_dir():
        return []
    found = [PreparedDataset(p.name, p) for p in sorted(prepared.iterdir()) if (p / MANIFEST_FILE).is_file()]
    return found


def read_checked_csv(path: Path, columns: Sequence[str], not_found: str, unreadable_hint: str = "") -> pd.DataFrame:
    """Read a CSV file that must exist and hold ``columns``; anything else is a one-line ``DashboardError`` naming
    the file: ``"<path> not found: <not_found>"``, an unreadable file (with ``unreadable_hint`` after the parser's
    message) or the columns it lacks."""
    if not path.is_file():
        raise DashboardError(f"{path} not found: {not_found}")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DashboardError(f"{path} is not a readable CSV ({exc}){unreadable_hint}") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DashboardError(f"{path} lacks columns {missing}; it must have {list(columns)}")
    return frame


def load_manifest(dataset: Path) -> pd.DataFrame:
    """Read and check ``manifest.csv``; raise a one-line ``DashboardError`` naming the file when it is malformed."""
    path = dataset / MANIFEST_FILE
    frame = read_checked_csv(
        path,
        MANIFEST_COLUMNS,
        not_found=f"prepare the dataset first (gastric-fl prepare ... --out {dataset})",
        unreadable_hint="; re-run gastric-fl prepare",
    )
    frame["label"] = frame["label"].astype(str)  # class names such as Fashion-MNIST's 0 ... 9 stay names
    classes = dataset_classes(dataset)
    bad_split = sorted(set(frame["split"]) - set(SPLITS))
    bad_label = sorted(set(frame["label"]) - set(classes))
    if bad_split or bad_label:
        raise DashboardError(f"{path}: unknown split {bad_split} or label {bad_label}; expected {SPLITS} and {classes}")
    for column in ("client", "channels", "size"):
        values = pd.to_numeric(frame[column], errors="coerce")
        if values.isna().any() or (values % 1 != 0).any():
            row = int(values.isna().idxmax() if values.isna().any() else (values % 1 != 0).idxmax())
            raise DashboardError(
                f"{path}: {column} must be a whole number (row {row + 2} is {frame[column].iloc[row]!r}); "
                "re-run gastric-fl prepare"
            )
        frame[column] = values.astype(int)
    return frame


def dataset_classes(dataset: Path) -> tuple[str, ...]:
    """The dataset's class names in class-index order: ``prepare.json``'s ``classes`` (e.g. Fashion-MNIST's ``0`` ...
    ``9``), else the binary task's (``normal``, ``abnormal``); an unreadable record counts as none."""
    try:
        named = load_prepare_json(dataset).get("classes")
    except DashboardError:
        named = None
    return tuple(str(c) for c in named) if isinstance(named, list) and named else LABELS


def load_prepare_json(dataset: Path) -> dict[str, Any]:
    """The resolved preparation record (`infra.records.read_prepare_record`), or ``{}`` when the dataset has none
    (the manifest alone is enough) or it holds no JSON object; a one-line ``DashboardError`` when it cannot be
    read."""
    if not (dataset / PREPARE_RECORD).is_file():
        return {}
    try:
        return dict(read_prepare_record(dataset).data)
    except RecordError as exc:
        if exc.kind == "malformed":
            return {}
        if isinstance(exc.cause, json.JSONDecodeError | UnicodeDecodeError):
            raise DashboardError(f"{exc.path} is not valid JSON ({exc.cause}); re-run gastric-fl prepare") from exc
        raise DashboardError(f"{exc}; re-run gastric-fl prepare") from exc


def stored_tile_px(dataset: Path, relative: str) -> int | None:
    """Side of a stored tile PNG in pixels (PIL reads only the header), or ``None`` if it cannot be opened."""
    try:
        with Image.open(dataset / relative) as image:
            return int(max(image.size))
    except (OSError, ValueError):
        return None


def counts_table(manifest: pd.DataFrame, dataset: Path | None = None, classes: Sequence[str] = LABELS) -> pd.DataFrame:
    """One row per hospital: tiles per split x label (one column per class of ``classes``), total, grayscale flag and
    tile sizes.

    ``grayscale`` is true when every tile of the client has one channel (data/README.md: ``channels`` = 1 for
    grayscale clients). ``source px`` is the tile side in the original slide; ``stored px`` (when ``dataset`` is
    given) the side of the PNG written, which differs when prepare resized the tiles.
    """
    rows: list[dict[str, Any]] = []
    for hospital, group in manifest.groupby("client", sort=True):
        row: dict[str, Any] = {"hospital": hospital_label(int(hospital))}
        for split in SPLITS:
            for label in classes:
                row[f"{split} {label}"] = int(((group["split"] == split) & (group["label"] == label)).sum())
        row["total"] = len(group)
        row["grayscale"] = bool((group["channels"] == 1).all())
        sizes = sorted({int(s) for s in group["size"]})
        row["source px"] = ", ".join(str(s) for s in sizes)
        if dataset is not None:
            px = stored_tile_px(dataset, str(group["path"].iloc[0]))
            row["stored px"] = "?" if px is None else str(px)
        rows.append(row)
    return pd.DataFrame(rows)


def sample_tiles(
    manifest: pd.DataFrame, hospital: int, per_label: int = 4, seed: int = 0, classes: Sequence[str] = LABELS
) -> pd.DataFrame:
    """A reproducible sample of one hospital's tiles, ``per_label`` of each label of ``classes`` (fewer if it has
    fewer)."""
    group = manifest[manifest["client"] == hospital]
    parts = []
    for label in classes:
        rows = group[group["label"] == label]
        if len(rows):
            parts.append(rows.sample(n=min(per_label, len(rows)), random_state=seed))
    if not parts:
        return group.head(0)
    return pd.concat(parts, ignore_index=True)


@dataclass(frozen=True)
class ShortcutProbe:
    """What the Data page and the HTML report show of ``prepare.json``'s shortcut probe (`pipeline.probe`)."""

    table: pd.DataFrame  # one row per statistic, one AUC column per split
    warning: str | None  # prepare's one-line warning when a statistic separates the classes above the limit
    limit: float
    departure: str | None  # set when the training tiles were whitened outside the mask (--mask-outside)


def shortcut_probe(record: dict[str, Any]) -> ShortcutProbe | None:
    """The shortcut probe of a prepare record, or ``None`` for a dataset prepared before prepare measured it."""
    probe = record.get("shortcut_probe")
    if not isinstance(probe, dict) or not isinstance(probe.get("splits"), dict):
        return None
    splits: dict[str, Any] = probe["splits"]
    statistics = probe.get("statistics")
    described: dict[str, Any] = statistics if isinstance(statistics, dict) else {}
    names = [name for name in described] or sorted({k for row in splits.values() for k in row if k != "tiles"})
    rows = []
    for name in names:
        row: dict[str, Any] = {"statistic": str(described.get(name, name))}
        for split, values in splits.items():
            value = values.get(name) if isinstance(values, dict) else None
            tiles = values.get("tiles") if isinstance(values, dict) else None
            if not tiles:
                continue  # a split without tiles (no validation split) has nothing to show
            row[f"{split} AUC ({tiles} tiles)"] = None if value is None else float(value)
        rows.append(row)
    labels = record.get("labels")
    departure = labels.get("departure") if isinstance(labels, dict) else None
    warning = probe.get("warning")
    return ShortcutProbe(
        table=pd.DataFrame(rows),
        warning=str(warning) if warning else None,
        limit=float(probe.get("warn_above", 0.7)),
        departure=str(departure) if departure else None,
    )
