"""Facts of the formats between stages that more than one top-level folder needs (docs/design.md, "Data flow and the
formats between stages"), so that each is written once and no folder imports another's internals for it.

- `BINARY_CLASSES`: the binary task's class names in class-index order (0 normal, 1 abnormal), as ``prepare``
  writes them into ``manifest.csv``'s ``label`` column and the folders ``{train,test}/{normal,abnormal}``, as a
  hospital's ``predictions.csv`` and a model card name them.
- `PREPARE_RECORD`: the prepared dataset's record, ``prepare.json``.
- `MANIFEST_FILE`: the prepared dataset's tile list, ``manifest.csv`` (one row per tile: client, split, label, path,
  source, ...), what every stage after ``prepare`` reads; `manifest_sha256` names which tiles, splits and labels
  a dataset holds (a hospital records it, a model card names it).
- `hospital_name`: ``client_XX`` (two digits, `HOSPITAL_PREFIX`), the one spelling of a hospital's folder name:
  its tiles' folder in a prepared dataset, its folder in a run (``federation.runfiles.hospital_dir``), its kit.

Standard library only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

BINARY_CLASSES: tuple[str, str] = ("normal", "abnormal")
SLIDE_SUMMARY_FILE = "summary.json"  # predict's summary of one slide, beside its tiles.csv and overlay.png
PREPARE_RECORD = "prepare.json"
MANIFEST_FILE = "manifest.csv"
HOSPITAL_PREFIX = "client_"


def hospital_name(hospital: int) -> str:
    """``client_XX``: the folder (and kit) name of hospital ``hospital``."""
    return f"{HOSPITAL_PREFIX}{hospital:02d}"


def manifest_sha256(dataset: Path) -> str:
    """sha256 of ``<dataset>/manifest.csv``: which tiles, splits and labels a hospital trains on."""
    digest = hashlib.sha256()
    with (dataset / MANIFEST_FILE).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
