"""What a result may be used for, and whether its slides are real: said on every result (the dashboard's result
pages, the HTML report, the model card, ``report``).

Every model this product trains is a research artefact: ``INTENDED_USE``. A prepared dataset whose slides were made
by ``gastric-fl synth`` (its input folder holds synth's marker, ``synth.json``) is recorded as such by ``prepare``
(``prepare.json``: ``"synthetic": true``), and everything trained on it says so (``SYNTHETIC_NOTE``). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.records import RecordError, read_prepare_record

INTENDED_USE = "Research use only, not for diagnosis."
SYNTHETIC_NOTE = "Trained and tested on synthetic slides (made by gastric-fl synth), not on patients' slides."
MASKED_NOTE = (
    "Its training tiles were whitened outside the cancer mask (prepare --mask-outside, paper Step a.1): a departure "
    "that writes the label into the pixels; test tiles are raw."
)
SYNTH_MARKER = "synth.json"  # what `gastric-fl synth` writes beside its slides (pipeline.synth.MARKER)


def synthetic_source(input_folder: Path) -> bool:
    """Whether a raw input folder holds slides made by ``gastric-fl synth`` (its marker file is there)."""
    return (Path(input_folder) / SYNTH_MARKER).is_file()


def _prepare_record(dataset: Path | None) -> Mapping[str, Any] | None:
    """A prepared dataset's ``prepare.json`` as a JSON object (`infra.records.read_prepare_record`), or ``None`` (no
    dataset, no file, not readable, not a JSON object)."""
    if dataset is None:
        return None
    try:
        return read_prepare_record(Path(dataset)).data
    except RecordError:
        return None


def dataset_is_synthetic(dataset: Path | None) -> bool:
    """Whether a prepared dataset's slides were made by ``gastric-fl synth``: ``prepare.json``'s ``synthetic``
    flag, or, for a dataset prepared before the flag existed, synth's marker in the input folder it names."""
    record = _prepare_record(dataset)
    if record is None:
        return False
    if isinstance(record.get("synthetic"), bool):
        return bool(record["synthetic"])
    config = record.get("config")
    source = config.get("source") if isinstance(config, dict) else None
    folder = source.get("input") if isinstance(source, dict) else None
    return isinstance(folder, str) and bool(folder) and synthetic_source(Path(folder))


def dataset_departure(dataset: Path | None) -> str | None:
    """The departure a prepared dataset records in ``prepare.json`` (``labels.departure``: training tiles whitened
    outside the cancer mask, ``--mask-outside``), or ``None``."""
    record = _prepare_record(dataset)
    labels = record.get("labels") if record is not None else None
    departure = labels.get("departure") if isinstance(labels, dict) else None
    return departure if isinstance(departure, str) and departure else None


def intended_use(dataset: Path | None = None, *, synthetic: bool | None = None) -> str:
    """The sentence every result carries: ``INTENDED_USE``, plus ``SYNTHETIC_NOTE`` when the dataset (or
    ``synthetic``, when the caller knows) is synthetic, plus `MASKED_NOTE` when its training tiles were whitened
    outside the mask (a departure its results must name wherever they appear)."""
    made_up = dataset_is_synthetic(dataset) if synthetic is None else synthetic
    text = f"{INTENDED_USE} {SYNTHETIC_NOTE}" if made_up else INTENDED_USE
    return f"{text} {MASKED_NOTE}" if dataset_departure(dataset) else text
