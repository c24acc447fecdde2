"""A hospital's tiles, read once from ``manifest.csv`` into memory, and H&E-style augmentation.

Reads the prepared-dataset contract of ``data/README.md`` section 2 (the output of ``gastric-fl prepare``,
FedSAF paper 001, Sec. 4.2): one row per tile with ``client, split, label, path, ..., channels``. Each client's
train and test tiles are decoded once, resized to ``input_size`` and kept as ``uint8`` arrays (N, S, S, C);
batches are augmented on ``uint8`` and normalised on the fly.

The class list (class index order) is the dataset's, the same for every hospital of it: ``prepare.json``'s
``classes`` when present; otherwise the manifest's labels, ``normal``, ``abnormal`` when no other label is there
(the binary task: index 1 = abnormal), else in natural order (``2`` before ``10``), as ``gastric-fl prepare``
orders class folders. It is the dataset's, not the hospital's own: a hospital whose tiles lack a class (label
skew) still has a model with one output per class of the dataset.

Grayscale hospitals (``channels == 1``): with ``in_chans == 3`` (the default) their tiles are replicated to three
identical channels, so every hospital uses the same architecture and every layer can be shared; with
``in_chans == 1`` every tile of every hospital is converted to gray instead. The decoding, channel handling,
resize and normalisation are `models.preprocess` (shared with ``gastric-fl predict``): this module only reads
files and checks them.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import albumentations as A
import cv2
import numpy as np
import torch

from federation.errors import FederationError
from federation.wire.contract import CLASS_NAME, LABELS
from infra.formats import MANIFEST_FILE, PREPARE_RECORD
from infra.outputs import FolderPaths, PathOutsideError
from infra.records import RecordError, read_prepare_record
from models.preprocess import default_stats, fit_tile, normalise, tile_from_decoded

SPLITS: tuple[str, ...] = ("train", "val", "test")
REQUIRED_COLUMNS: tuple[str, ...] = ("client", "split", "label", "path", "channels")
MIN_TRAIN_TILES = 2  # BatchNorm needs two samples in a training batch
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"  # prepare writes PNG tiles; the content decides, not the name


@dataclass(frozen=True)
class ManifestRow:
    """One tile of ``manifest.csv`` (the columns the federation needs)."""

    hospital: int
    split: str
    label: int
    path: str
    channels: int


@dataclass
class HospitalData:
    """One hospital's tiles in memory: ``uint8`` images (N, S, S, C) and ``int64`` labels (N,)."""

    hospital: int
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    test_paths: list[str]
    grayscale: bool
    classes: tuple[str, ...] = LABELS
    # the slide each training tile comes from (prepare's tile names, models.decision.slides_of_tiles): the unit
    # differential privacy protects; None when the names do not say (a dataset not made by prepare)
    train_units: tuple[str, ...] | None = None
    # the validation split (prepare's ``val``; slide-disjoint from train and test): where a threshold is chosen.
    # Empty for a hospital with too few slides or a dataset prepared without one.
    val_x: np.ndarray | None = None
    val_y: np.ndarray | None = None
    val_paths: list[str] = field(default_factory=list)

    @property
    def num_val(self) -> int:
        return 0 if self.val_y is None else int(self.val_y.shape[0])

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key ordering digit runs by value (``2`` before ``10``), as prepare orders class folders."""
    parts = [part for part in re.split(r"(\d+)", name) if part]
    return tuple((0, int(part)) if part.isdigit() else (1, part.casefold()) for part in parts)


def prepared_classes(dataset: str | Path) -> tuple[str, ...] | None:
    """``classes`` of ``<dataset>/prepare.json`` (class-index order), checked; ``None`` when the file is absent,
    unreadable or older than class lists (then the manifest's labels decide, `classes_of_labels`)."""
    try:
        record = read_prepare_record(Path(dataset))
    except RecordError:
        return None
    path, classes = record.path, record.classes
    if classes is None:
        return None
    if (
        not isinstance(classes, list)
        or len(classes) < 2
        or len(set(classes)) != len(classes)
        or not all(isinstance(c, str) and CLASS_NAME.match(c) for c in classes)
    ):
        raise FederationError(
            f"{path}: classes must list at least two distinct plain names (letters, digits, '.', '_', '-'), "
            f"got {classes!r}; re-run gastric-fl prepare"
        )
    return tuple(classes)


def classes_of_labels(labels: set[str], where: str = MANIFEST_FILE) -> tuple[str, ...]:
    """The class list a manifest without ``prepare.json`` implies: ``LABELS`` when its labels are among them,
    else the labels in natural order (at least two)."""
    if labels <= set(LABELS):
        return LABELS
    if len(labels) < 2:
        raise FederationError(
            f"{where} names one class ({sorted(labels)[0]!r}); a classifier needs at least two: re-run gastric-fl "
            "prepare with at least two class folders"
        )
    return tuple(sorted(labels, key=_natural_key))


def read_manifest(dataset: str | Path) -> list[ManifestRow]:
    """Parse and check ``<dataset>/manifest.csv``; raises ``FederationError`` naming the file and line.

    Checked once here, for every reader: the columns, each row's values (its label one of the dataset's classes,
    `read_dataset`), that each tile path stays inside the dataset folder (no absolute path, no ``..``, no
    symlink out of it: `infra.outputs.FolderPaths`) and that no tile is listed twice (it would weigh double,
    or sit in both splits). A UTF-8 byte-order mark, as some spreadsheet programs save it, is accepted.
    """
    return read_dataset(dataset)[0]


def read_dataset(dataset: str | Path) -> tuple[list[ManifestRow], tuple[str, ...]]:
    """``read_manifest``'s rows (``label`` as the class index) and the dataset's class list (module docstring)."""
    folder = Path(dataset)
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        raise FederationError(
            f"{manifest} not found: point data.path (or --data) at a folder made by gastric-fl prepare"
        )
    records: list[tuple[int, int, str, str, str, int]] = []
    inside = FolderPaths(folder)
    seen: dict[Path, int] = {}
    with manifest.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise FederationError(f"{manifest} lacks the columns {missing}: re-run gastric-fl prepare")
        for line, record in enumerate(reader, start=2):
            try:
                hospital = int(record["client"])
                channels = int(record["channels"])
            except (TypeError, ValueError) as exc:
                raise FederationError(f"{manifest} line {line}: client and channels must be integers") from exc
            split, label, path = record["split"], record["label"], record["path"]
            if hospital < 0 or split not in SPLITS or not label or channels not in (1, 3) or not path:
                raise FederationError(
                    f"{manifest} line {line}: expected client >= 0, split in {SPLITS}, a label, "
                    f"channels 1 or 3 and a path; got {hospital}, {split!r}, {label!r}, {channels}, {path!r}"
                )
            try:
                where = inside(path)
            except PathOutsideError as exc:
                raise FederationError(f"{manifest} line {line}: {exc}; re-run gastric-fl prepare") from None
            key = Path(os.path.normpath(where))
            if key in seen:
                raise FederationError(
                    f"{manifest} line {line}: tile {path} is already listed on line {seen[key]}; a tile listed twice "
                    "counts twice (or sits in both splits): remove the duplicate row or re-run gastric-fl prepare"
                )
            seen[key] = line
            records.append((line, hospital, split, label, path, channels))
    if not records:
        raise FederationError(f"{manifest} lists no tiles: re-run gastric-fl prepare on a non-empty raw folder")
    labels = {r[3] for r in records}
    classes = prepared_classes(folder)
    if classes is None:
        bad = sorted(label for label in labels if not CLASS_NAME.match(label))
        if bad:
            line = next(r[0] for r in records if r[3] == bad[0])
            raise FederationError(
                f"{manifest} line {line}: label {bad[0]!r} is not a plain class name (letters, digits, '.', '_', "
                "'-'); re-run gastric-fl prepare"
            )
        classes = classes_of_labels(labels, str(manifest))
    index = {name: i for i, name in enumerate(classes)}
    rows: list[ManifestRow] = []
    for line, hospital, split, label, path, channels in records:
        if label not in index:
            raise FederationError(
                f"{manifest} line {line}: label {label!r} is not one of the dataset's classes {list(classes)} "
                f"({folder / PREPARE_RECORD}); re-run gastric-fl prepare"
            )
        rows.append(ManifestRow(hospital, split, index[label], path, channels))
    return rows, classes


def manifest_hospitals(rows: Sequence[ManifestRow]) -> list[int]:
    """Hospital indices in the manifest, checked to be 0..m-1 with none missing."""
    present = sorted({r.hospital for r in rows})
    expected = list(range(present[-1] + 1))
    empty = sorted(set(expected) - set(present))
    if empty:
        raise FederationError(f"hospital(s) {empty} have no tiles in the manifest: re-run gastric-fl prepare")
    return present


def _read_tile(file: Path, input_size: int, in_chans: int) -> np.ndarray:
    """Decode one tile (by content: a PNG whatever its name) to ``uint8`` of side ``input_size``."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise FederationError(
            f"tile {file} cannot be read ({exc.strerror or exc}): re-run gastric-fl prepare"
        ) from None
    if not data:
        raise FederationError(f"tile {file} is empty (0 bytes): re-run gastric-fl prepare")
    if not data.startswith(PNG_MAGIC):
        raise FederationError(
            f"tile {file} is not a PNG image (it starts with {data[:8]!r}): re-run gastric-fl prepare"
        )
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise FederationError(f"tile {file} cannot be decoded as a PNG image: re-run gastric-fl prepare")
    return fit_tile(tile_from_decoded(image), input_size, in_chans)


def check_hospitals(folder: Path, rows: Sequence[ManifestRow], hospitals: Sequence[int] | None = None) -> list[int]:
    """The chosen hospitals (default: all), after checking that each has its tiles on disk and enough of them.

    Cheap (no image is decoded), so the engine calls it before starting any worker process.
    """
    present = manifest_hospitals(rows)
    chosen = present if hospitals is None else sorted(hospitals)
    absent = [c for c in chosen if c not in present]
    if absent:
        raise FederationError(f"strategy.clients names {absent}, but {folder} has hospitals {present}")
    missing = [r.path for r in rows if r.hospital in chosen and not (folder / r.path).is_file()]
    if missing:
        raise FederationError(
            f"tile {folder / missing[0]} listed in {MANIFEST_FILE} does not exist ({len(missing)} missing in all): "
            "the prepared folder is incomplete, re-run gastric-fl prepare"
        )
    for c in chosen:
        train = sum(1 for r in rows if r.hospital == c and r.split == "train")
        test = sum(1 for r in rows if r.hospital == c and r.split == "test")
        if train < MIN_TRAIN_TILES or not test:
            raise FederationError(
                f"hospital {c} has {train} training and {test} test tiles: every hospital needs at least "
                f"{MIN_TRAIN_TILES} training and 1 test tile (re-run gastric-fl prepare with fewer clients)"
            )
    return chosen


def load_hospitals(
    dataset: str | Path, input_size: int, in_chans: int = 3, hospitals: Sequence[int] | None = None
) -> dict[int, HospitalData]:
    """Decode every tile of the chosen ``hospitals`` (default: all) once, as ``uint8`` arrays of side ``input_size``.

    Raises ``FederationError`` naming the file for a missing or unreadable tile, and naming the hospital for one
    without training tiles (fewer than two) or without test tiles.
    """
    folder = Path(dataset)
    rows, classes = read_dataset(folder)
    chosen = check_hospitals(folder, rows, hospitals)
    out: dict[int, HospitalData] = {}
    for c in chosen:
        mine = [r for r in rows if r.hospital == c]
        train = [r for r in mine if r.split == "train"]
        test = [r for r in mine if r.split == "test"]
        val = [r for r in mine if r.split == "val"]
        out[c] = HospitalData(
            hospital=c,
            train_x=np.stack([_read_tile(folder / r.path, input_size, in_chans) for r in train]),
            train_y=np.array([r.label for r in train], dtype=np.int64),
            test_x=np.stack([_read_tile(folder / r.path, input_size, in_chans) for r in test]),
            test_y=np.array([r.label for r in test], dtype=np.int64),
            test_paths=[r.path for r in test],
            grayscale=all(r.channels == 1 for r in mine),
            classes=classes,
            train_units=_units([r.path for r in train]),
            val_x=np.stack([_read_tile(folder / r.path, input_size, in_chans) for r in val]) if val else None,
            val_y=np.array([r.label for r in val], dtype=np.int64) if val else None,
            val_paths=[r.path for r in val],
        )
    return out


def _units(paths: list[str]) -> tuple[str, ...] | None:
    from models.decision import slides_of_tiles

    keys = slides_of_tiles(paths)
    return None if keys is None else tuple(keys)


def make_augmenter(seed: int) -> A.Compose:
    """Augmentation for H&E tiles, deterministic given ``seed``.

    Tissue has no orientation, so all eight flips/rotations are equally plausible (``SquareSymmetry``); stain
    intensity varies between labs and scanners, so hue, saturation, brightness and contrast shift mildly.
    """
    return A.Compose(
        [
            A.SquareSymmetry(p=1.0),
            A.HueSaturationValue(hue_shift_limit=8, sat_shift_limit=12, val_shift_limit=8, p=0.5),
            A.RandomBrightnessContrast(brightness_limit=0.1, contrast_limit=0.1, p=0.5),
        ],
        seed=seed,
    )


def augment_batch(augmenter: A.Compose, images: np.ndarray) -> np.ndarray:
    """Apply ``augmenter`` to each ``uint8`` image of a (B, S, S, C) batch."""
    out = np.empty_like(images)
    for i, image in enumerate(images):
        result = augmenter(image=image)["image"]
        out[i] = result.reshape(image.shape)  # albumentations drops a trailing axis of size 1
    return out


def to_tensor(images: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """``uint8`` (B, S, S, C) -> normalised ``float32`` (B, C, S, S) on ``device`` (`models.preprocess.normalise`
    with the default statistics for C channels, the ones every model card records)."""
    return normalise(images, *default_stats(images.shape[3]), device)


def extract_hospital(dataset: str | Path, hospital: int, out: Path) -> Path:
    """Hospital ``hospital``'s part of a prepared dataset of several hospitals, as a dataset of its own: its rows only
    (renumbered client 0), its tiles (hard links where the file system allows, else copies) and a ``prepare.json``
    that concerns it alone (`_own_record`). What a hospital holds when it prepared only its own slides (``prepare
    --clients 1``); the loopback deployment (``federation demo``) gives each hospital such a dataset, so that none
    holds another's tile paths, slide names, file hashes or labels. ``report.md`` and ``contact_sheet.png``, which
    show every hospital, are not copied. ``out`` must not exist."""
    source = Path(dataset)
    rows, classes = read_dataset(source)
    check_hospitals(source, rows, [hospital])
    with (source / MANIFEST_FILE).open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        fields = list(reader.fieldnames or [])
        records = [r for r in reader if int(r["client"]) == hospital]
    out.mkdir(parents=True)
    for record in records:
        target = out / record["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / record["path"], target)
        except OSError:
            target.write_bytes((source / record["path"]).read_bytes())
        record["client"] = "0"
    with (out / MANIFEST_FILE).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(records)
    try:
        prepared = dict(read_prepare_record(source).data)
    except RecordError:
        prepared = {}
    own = _own_record(prepared, hospital, records, classes)
    own["extracted_from"] = {"dataset": str(source.resolve()), "client": hospital}
    (out / PREPARE_RECORD).write_text(json.dumps(own, indent=2) + "\n", encoding="utf-8")
    return out


# Fields of prepare.json (docs/pipeline.md) that describe the preparation as a whole and name no slide: copied as they
# are. The record of an extracted hospital is built from an allow-list: a field prepare gains later is left out
# here until it is known to name none of another hospital's slides.
_SETTINGS_FIELDS: tuple[str, ...] = ("format_version", "versions", "white_definition", "synthetic")
# config sections without per-hospital values (but split.partition's case mix, cut by _own_config)
_SETTINGS_SECTIONS: tuple[str, ...] = ("source", "split", "tiles")


def _is_hospital(entry: object, hospital: int) -> bool:
    """Whether a per-hospital or per-slide entry of ``prepare.json`` is hospital ``hospital``'s."""
    return isinstance(entry, dict) and str(entry.get("client")) == str(hospital)


def _own_config(config: dict[str, Any], hospital: int) -> dict[str, Any]:
    """``prepare.json``'s ``config`` with its per-hospital settings cut to ``hospital``'s, renumbered client 0: the
    settings of the preparation this hospital's slides come from (``split`` still says how many hospitals shared
    them out, and a case mix ``abnormal:...`` only this hospital's share); ``clients[0]`` of the record holds the
    hospital's resolved values."""
    own = {name: config[name] for name in _SETTINGS_SECTIONS if isinstance(config.get(name), dict)}
    split = own.get("split")
    partition = split.get("partition") if isinstance(split, dict) else None
    if isinstance(split, dict) and isinstance(partition, str) and partition.startswith("abnormal:"):
        # a case mix lists every hospital's share of abnormal slides: keep this hospital's own only
        shares = partition.removeprefix("abnormal:").split(",")
        own["split"] = {**split, "partition": f"abnormal:{shares[hospital]}" if hospital < len(shares) else "abnormal"}
    hospitals = config.get("clients")
    if isinstance(hospitals, dict):
        grayscale, scale, tile = (hospitals.get(key) for key in ("grayscale", "scale", "tile"))
        own["clients"] = {
            "grayscale": [0] if isinstance(grayscale, list) and hospital in grayscale else [],
            "scale": [scale[hospital]] if isinstance(scale, list) and hospital < len(scale) else [],
            "tile": [tile[hospital]] if isinstance(tile, list) and hospital < len(tile) else [],
        }
        group = hospitals.get("group")
        if isinstance(group, list):
            own["clients"]["group"] = [group[hospital]] if hospital < len(group) else []
    sites = config.get("sites")
    if isinstance(sites, dict):
        listed = sites.get("profile")
        own["sites"] = {
            "shift": sites.get("shift"),
            "strength": sites.get("strength"),
            "profile": [{**p, "client": 0} for p in listed if _is_hospital(p, hospital)]
            if isinstance(listed, list)
            else [],
        }
    return own


def _own_record(
    record: dict[str, Any], hospital: int, rows: list[dict[str, str]], classes: tuple[str, ...]
) -> dict[str, Any]:
    """The ``prepare.json`` of hospital ``hospital``'s extracted dataset (manifest ``rows``, already client 0), made
    from the multi-hospital ``record`` by an allow-list: what describes the preparation as a whole (format, versions,
    white definition, settings: `_own_config`), this client's ``clients`` entry and this hospital's ``slides``
    (renumbered client 0), ``source_sha256`` / ``source_pixels_sha256`` / ``warnings`` of its slides' files only (each
    slide and the mask or annotation prepare read for it, as its ``slides`` entry lists them in ``files``; a record
    from before that field keeps the slides' own entries only), and ``totals`` recounted over its own rows and
    slides.

    Left out: ``skipped`` (slides no hospital got tiles from, named in their reasons), ``manifest_rows_sha256``
    (a hash over every hospital's rows; ``hospital.json`` records the sha256 of this dataset's own manifest.csv),
    and any field not listed here.
    """
    config = record.get("config") if isinstance(record.get("config"), dict) else None
    sources = {r["source"] for r in rows if r.get("source")}
    listed = record.get("slides")
    slides = [{**s, "client": 0} for s in listed if _is_hospital(s, hospital)] if isinstance(listed, list) else None
    sources |= {s["source"] for s in slides or [] if isinstance(s.get("source"), str)}
    files = sources | {
        f for s in slides or [] if isinstance(s.get("files"), list) for f in s["files"] if isinstance(f, str)
    }
    own: dict[str, Any] = {name: record[name] for name in _SETTINGS_FIELDS if name in record}
    if config is not None:
        own["config"] = _own_config(config, hospital)
    own["classes"] = list(classes)
    entries = record.get("clients")
    if isinstance(entries, list):
        own["clients"] = [{**e, "client": 0} for e in entries if _is_hospital(e, hospital)]
    own["totals"] = {
        "tiles": len(rows),
        "by_label": {label: sum(1 for r in rows if r["label"] == label) for label in classes},
    }
    if slides is not None:
        own["totals"] |= {"slides": len(slides), "slides_without_tiles": sum(1 for s in slides if not s.get("tiles"))}
        own["slides"] = slides
    warnings = record.get("warnings")
    if isinstance(warnings, list):
        # each warning starts with the file it is about ("<file>: ..."), as prepare writes them
        own["warnings"] = [w for w in warnings if isinstance(w, str) and w.split(": ", 1)[0] in files]
    for name, keep in (("source_sha256", files), ("source_pixels_sha256", sources)):
        digests = record.get(name)
        if isinstance(digests, dict):
            own[name] = {k: v for k, v in digests.items() if k in keep}
    return own
