"""A hospital's model card after an evaluated round (issue 12, part 1; the format is `models.bundle`).

`export_card` gathers, from what the hospital owns, everything ``model.json`` says about ``model.safetensors``:

* the architecture and ``nhead`` from the run's configuration, the classes from the hospital's dataset (as
  its ``Hello`` reply told the server), and the head's layer units
  (`models.split_units`, FedSAF paper 001, Eq. 1: the last ``nhead`` units stay at the hospital);
* the preprocessing from tile to tensor (`models.preprocess.Preprocess`): ``data.input_size`` and
  ``model.in_chans`` from the configuration, the hospital's tile size, scale and colour from the dataset's
  ``prepare.json``, ImageNet normalisation; and the tile grid prepare cut (`models.bundle.TileGrid`);
* the provenance: run id, round, client, the dataset folder and the sha256 of its ``manifest.csv`` as recorded in
  ``hospital.json`` when the run started;
* under differential privacy (`federation.hospital.privacy`), the guarantee of the weights: epsilon at delta from the
  hospital's own ledger, the unit protected, the noise multiplier, sampling rate, clip norm and DP-SGD steps;
* the hospital's test metrics of that round, recomputed from the ``predictions.csv`` it has just written (the
  evaluation's own probabilities): tiles, accuracy (argmax), AUC, and sensitivity/specificity at the threshold.

The binary task (classes ``normal``, ``abnormal``) is a threshold on ``P(abnormal)``. Any other class list has no
positive class: the card's decision is ``argmax`` (its threshold unused), its metrics are the tiles per class,
accuracy (argmax) and the macro one-vs-rest AUC over the classes present
(`federation.hospital.evaluation.multiclass_auc`).

`export_round` is the hospital's export after an evaluated round: the card, the bundle replaced as one
(`replace_bundle`), and the hospital's description of its own tissue (`federation.hospital.tissue`).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from federation.config import RunConfig
from federation.hospital.data import HospitalData
from federation.hospital.evaluation import auc_of, auc_or_none
from federation.hospital.privacy import ACCOUNTANT_FILE, ACCOUNTANT_NAME, Accountant
from federation.runfiles import CHECKPOINT_DIR, HOSPITAL_FILE, PREDICTIONS_FILE
from federation.runs import now_iso, read_json
from federation.strategies import default_nhead
from federation.wire.contract import LABELS
from infra.provenance import dataset_is_synthetic, intended_use
from infra.records import read_prepare_record
from models import split_units
from models.bundle import DEFAULT_THRESHOLD, ModelCard, TileGrid, decision_counts
from models.decision import slides_of_tiles, uncertainty
from models.names import CARD_FILE, WEIGHTS_FILE
from models.preprocess import Preprocess


def _prepare_record(dataset: Path, hospital: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(client entry, tiles settings)`` of ``<dataset>/prepare.json``; ``None`` when absent or unusable."""
    try:
        record = read_prepare_record(dataset).data
        entry = next(c for c in record["clients"] if int(c["client"]) == hospital)
        return entry, dict(record["config"]["tiles"]) | {"format": record["config"]["source"]["format"]}
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


def card_metrics(
    predictions: Path, threshold: float = DEFAULT_THRESHOLD, classes: tuple[str, ...] = LABELS
) -> dict[str, Any]:
    """Metrics of the latest evaluation from ``predictions.csv``: counts, accuracy, AUC, sensitivity, specificity.

    Accuracy is the evaluation's own rule (the larger softmax output, ``prob > 0.5``); sensitivity and
    specificity use ``prob >= threshold`` (the card's decision rule), with their 95% Wilson intervals; when the tile
    names say their slides, the test slide count, the AUC's interval resampled by slide and the slide-level results
    (`models.decision.uncertainty`, issue 23). Undefined values are ``None``.
    ``classes`` other than the binary task's: `multiclass_card_metrics`.
    """
    if classes != LABELS:
        return multiclass_card_metrics(predictions, classes)
    labels: list[int] = []
    probs: list[float] = []
    paths: list[str] = []
    with predictions.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            labels.append(LABELS.index(row["label"]))
            probs.append(float(row["prob_abnormal"]))
            paths.append(str(row.get("path") or ""))
    y, p = np.asarray(labels, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    finite = bool(np.isfinite(p).all()) and len(p) > 0
    positive, negative = y == 1, y == 0
    rule = decision_counts(p, positive, negative, threshold)

    def ratio(num: int, den: int) -> float | None:
        return num / den if den and finite else None

    auc = auc_or_none(y, p) if finite else None
    return {
        "source": "predictions.csv of the round",
        "tiles": len(y),
        "abnormal": int(positive.sum()),
        "normal": int(negative.sum()),
        "acc": ratio(int(((p > 0.5) == positive).sum()), len(y)),
        "auc": None if auc is None or not math.isfinite(auc) else auc,
        "sensitivity": rule["sensitivity"] if finite else None,
        "specificity": rule["specificity"] if finite else None,
        "threshold": threshold,
        **(uncertainty(y, p, threshold, slides_of_tiles(paths)) if finite else {}),
    }


def multiclass_card_metrics(predictions: Path, classes: tuple[str, ...]) -> dict[str, Any]:
    """Metrics of the latest evaluation of a model with the class list ``classes`` (not the binary task) from its
    ``predictions.csv`` (one ``prob_<class>`` column per class): tiles, tiles per class, accuracy (argmax) and
    AUC (two classes: of the second class's probability; more: macro one-vs-rest over the classes present).
    Undefined values are ``None``."""
    labels: list[int] = []
    rows: list[list[float]] = []
    with predictions.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            labels.append(classes.index(row["label"]))
            rows.append([float(row[f"prob_{c}"]) for c in classes])
    y = np.asarray(labels, dtype=np.int64)
    p = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(classes))
    finite = bool(np.isfinite(p).all()) and len(p) > 0
    auc = auc_of(y, p) if finite else None
    return {
        "source": "predictions.csv of the round",
        "tiles": len(y),
        "per_class": {c: int((y == i).sum()) for i, c in enumerate(classes)},
        "acc": float((p.argmax(axis=1) == y).mean()) if finite else None,
        "auc": None if auc is None or not math.isfinite(auc) else auc,
    }


def export_card(
    *,
    config: RunConfig,
    model: nn.Module,
    dataset: Path,
    hospital: int,
    grayscale: bool,
    classes: tuple[str, ...] = LABELS,
    run_id: str,
    server_round: int,
    hospital_record: dict[str, Any],
    predictions: Path,
    privacy: dict[str, Any] | None = None,
) -> ModelCard:
    """The card of the model a hospital deploys after ``server_round`` (see the module docstring); ``classes``:
    its dataset's class names in class-index order."""
    nhead = config.strategy.nhead if config.strategy.nhead is not None else default_nhead(config.strategy.name)
    units = split_units(model)
    head = tuple(name for name, _ in units[len(units) - nhead :]) if nhead else ()
    prepared = _prepare_record(dataset, hospital)
    tiling: TileGrid | None = None
    tile_px: int | None = None
    scale: float | None = None
    source_format = ""
    if prepared is not None:
        entry, tiles = prepared
        tile_px, scale, grayscale = int(entry["tile_px"]), float(entry["scale"]), bool(entry["grayscale"])
        source_format = str(tiles["format"])
        tiling = TileGrid(
            source_px=int(entry["source_px"]),
            stride_px=int(entry["stride_source_px"]),
            abnormal_stride_px=int(entry["abnormal_stride_source_px"]),
            white_level=int(tiles["white_level"]),
            background_max=float(tiles["background_max"]),
            white_max=float(tiles["white_max"]),
            source_format=source_format,
            abnormal_coverage=float(tiles.get("abnormal_coverage", 0.5)),
            mask_outside=bool(tiles.get("mask_outside", False)),
        )
    preprocess = Preprocess(
        input_size=config.data.input_size,
        in_chans=config.model.in_chans,
        tile_px=tile_px,
        scale=scale,
        grayscale=grayscale,
    )
    return ModelCard(
        architecture=config.model.name,
        num_classes=len(classes),
        class_names=classes,
        positive_class="abnormal" if classes == LABELS else None,
        nhead=nhead,
        head_units=head,
        preprocess=preprocess,
        tiling=tiling,
        threshold=DEFAULT_THRESHOLD,
        run_id=run_id,
        round=server_round,
        hospital=hospital,
        dataset={
            "path": str(dataset),
            "format": source_format or None,
            "manifest_sha256": hospital_record.get("manifest_sha256"),
            "prepare_json": prepared is not None,
            "synthetic": dataset_is_synthetic(dataset),
        },
        intended_use=intended_use(dataset),
        norm=config.model.norm or "batch",
        privacy=privacy or {},
        metrics=card_metrics(predictions, classes=classes),
        written_at=now_iso(),
    )


def _hidden(folder: Path, name: str, suffix: str) -> Path:
    """A fresh hidden name beside ``folder / name`` (``.<name>.<random><suffix>``: the pattern a hospital's clean-up
    of temp files knows, `federation.hospital.store.remove_temp_files`)."""
    handle, path = tempfile.mkstemp(prefix=f".{name}.", suffix=suffix, dir=folder)
    os.close(handle)
    return Path(path)


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` holds ``source``'s bytes: a hard link where the file system allows (no copy), else a copy."""
    target.unlink(missing_ok=True)  # a link needs a free name
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def replace_bundle(folder: Path, card: ModelCard, weights: Path) -> None:
    """Replace the bundle in ``folder`` (``model.safetensors`` with the bytes of ``weights``, ``model.json`` with
    ``card``) as one: both new files are written beside the bundle first, hidden; only then is each renamed into
    place, weights first. Anything that fails before the renames (a full disk, an unreadable source) leaves the
    previous bundle untouched and no temp file; if the card's rename fails after the weights' one, the previous
    weights are put back, so the bundle never holds weights of one round and a card of another for longer than
    the two renames take (a reader in between is told by `models.bundle.check_round`)."""
    payload = (json.dumps(card.to_json(), indent=2, allow_nan=False) + "\n").encode("utf-8")
    folder.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    try:
        new_weights = _hidden(folder, WEIGHTS_FILE, ".tmp")
        made.append(new_weights)
        _link_or_copy(weights, new_weights)
        new_card = _hidden(folder, CARD_FILE, ".tmp")
        made.append(new_card)
        with new_card.open("wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        previous: Path | None = None
        if (folder / WEIGHTS_FILE).is_file():
            previous = _hidden(folder, WEIGHTS_FILE, ".prev")
            made.append(previous)
            _link_or_copy(folder / WEIGHTS_FILE, previous)
        os.replace(new_weights, folder / WEIGHTS_FILE)
        try:
            os.replace(new_card, folder / CARD_FILE)
        except BaseException:
            if previous is not None:
                os.replace(previous, folder / WEIGHTS_FILE)
            else:
                (folder / WEIGHTS_FILE).unlink(missing_ok=True)
            raise
    finally:
        for path in made:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def card_privacy(config: RunConfig, read_ledger: Callable[[], Accountant]) -> dict[str, Any]:
    """What the model card says of the weights' DP guarantee (empty without ``[privacy]``), from the hospital's
    ledger (``read_ledger``, read only under ``[privacy]``)."""
    privacy = config.privacy
    if not privacy.enabled:
        return {}
    ledger = read_ledger()
    if not ledger.entries:
        return {}
    trained = ledger.summary()  # what was trained, from the ledger, never what the run asked for
    return {
        "epsilon": ledger.epsilon(privacy.run_delta),
        "delta": privacy.run_delta,
        "unit": trained["unit"],
        "noise_multiplier": trained["noise_multiplier"],
        "sample_rate": trained["sample_rate"],
        "max_grad_norm": trained["max_grad_norm"],
        "tiles_per_unit": trained["tiles_per_unit"],
        "steps": ledger.steps,
        "accountant": ACCOUNTANT_NAME,
        "ledger": ACCOUNTANT_FILE,
        "not_covered": "the test metrics, training loss and Fisher trace the hospital reported (docs/privacy.md)",
    }


def export_round(
    folder: Path,
    *,
    config: RunConfig,
    model: nn.Module,
    data: HospitalData,
    dataset: Path,
    hospital: int,
    run_id: str,
    server_round: int,
    read_ledger: Callable[[], Accountant],
) -> None:
    """The model bundle (`models.bundle`) the hospital would deploy after ``server_round``, in its run's
    ``folder``: ``model.safetensors`` (a link to its checkpoint when the file system allows, so it costs no copy;
    its metadata names the round) and ``model.json``, its card (`export_card`); ``hospital``: the hospital's index in
    ``dataset``.

    The bundle is replaced as one, and only once everything it says is known: the card is made first (its DP
    guarantee reads the ledger, which may be refused), both files are written beside the bundle, then put in
    place together (`replace_bundle`). A round refused on the way leaves the last good bundle exactly as it was."""
    card = export_card(
        config=config,
        model=model,
        dataset=dataset,
        hospital=hospital,
        grayscale=data.grayscale,
        classes=data.classes,
        run_id=run_id,
        server_round=server_round,
        hospital_record=read_json(folder / HOSPITAL_FILE),
        predictions=folder / PREDICTIONS_FILE,
        privacy=card_privacy(config, read_ledger),
    )
    replace_bundle(folder, card, folder / CHECKPOINT_DIR / f"round_{server_round:04d}.safetensors")
    # the hospital's description of its own tissue (models.shift): written here, read by predict, never sent
    from federation.hospital.tissue import describe_tissue

    describe_tissue(model, data, folder, server_round)
