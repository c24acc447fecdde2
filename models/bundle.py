"""A hospital's model bundle: its weights and a JSON card saying how to use them (issue 12, part 1).

A bundle is a folder (a hospital's folder of a run, ``<run>/hospitals/client_XX/``) holding

```
model.safetensors   the whole state_dict the hospital deploys: the base as of the round + its own head
model.json          the card (`ModelCard`): architecture, classes, nhead, the preprocessing from tile to tensor
                    (`models.preprocess.Preprocess`), the tile grid prepare used (`TileGrid`), the decision
                    threshold, and the provenance (run id, round, client, dataset and its manifest sha256, metrics)
```

The binary task (classes ``normal``, ``abnormal``) decides by ``P(abnormal) >= threshold``. Any other class list
(a multi-class dataset such as scikit-learn's digits) has no positive class (``positive_class`` null): the card
says ``"decision": "argmax"`` (the class with the largest softmax output) and its threshold is not used.

A card is the model's data config in timm's sense plus a model card's provenance: everything ``gastric-fl
predict`` needs to turn a slide into the tensors the weights were trained on, and to say where they came from.
It lives in ``models`` because the federation writes it (``federation -> models``) and inference reads it
(``inference -> models``). `load_bundle` checks a bundle once, at the boundary, and raises `BundleError` with one
line naming the file and what to do for anything that does not fit.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from infra.formats import BINARY_CLASSES
from infra.outputs import atomic_target, write_atomic
from infra.provenance import INTENDED_USE
from models.card_history import (
    EDITED,
    MAX_BY,
    MAX_REASON,
    MAX_SOURCE,
    THRESHOLD_DEFAULT_SOURCE,
    history_problem,
    note_problem,
)
from models.decision import DEFAULT_THRESHOLD, NO_DESCRIPTION
from models.errors import ModelError
from models.names import CARD_FILE, MODEL_NAMES, TIMM_PREFIX, TISSUE_FILE, WEIGHTS_FILE, check_model_name, is_timm_name
from models.preprocess import Preprocess
from models.registry import create_model
from models.shift import TissueDescription, TissueError, read_description

CARD_FORMAT = "gastric-fl model card"
CARD_VERSION = 1


def decision_counts(
    probability: npt.NDArray[np.float64],
    positive: npt.NDArray[np.bool_],
    negative: npt.NDArray[np.bool_],
    threshold: float,
) -> dict[str, Any]:
    """The card's decision rule (``P(abnormal) >= threshold`` calls a tile abnormal) against known labels.

    ``tp``, ``fn``, ``tn``, ``fp`` and sensitivity, specificity; a rate whose class has no tile is ``None``.
    """
    called = probability >= threshold
    tp, fn = int((called & positive).sum()), int((~called & positive).sum())
    tn, fp = int((~called & negative).sum()), int((called & negative).sum())
    return {
        "tp": tp,
        "fn": fn,
        "tn": tn,
        "fp": fp,
        "sensitivity": tp / (tp + fn) if tp + fn else None,
        "specificity": tn / (tn + fp) if tn + fp else None,
    }


class BundleError(ModelError):
    """A model bundle that cannot be used as it is: missing files, a damaged card, weights that do not fit."""


@dataclass(frozen=True)
class TileGrid:
    """How prepare cut this hospital's tiles from a slide (`pipeline.tiling.HospitalPlan` and the white-area rule).

    Squares of ``source_px`` slide pixels on a grid of step ``stride_px`` (normal slides; ``abnormal_stride_px``
    on abnormal slides), kept when their share of near-white pixels (all RGB channels >= ``white_level``) is at
    most ``background_max``; a square of an annotated slide is abnormal when at least ``abnormal_coverage`` of its
    tissue is inside the annotation, normal when none of it is, neither in between (`pipeline.tiling`).
    ``mask_outside``: the training tiles were whitened outside the mask (paper Step a.1, a departure; then
    ``white_max`` was their filter). ``source_format``: the raw layout prepare read (``seed``, ``bot``, ...).
    """

    source_px: int
    stride_px: int
    abnormal_stride_px: int
    white_level: int
    background_max: float
    white_max: float
    source_format: str = ""
    abnormal_coverage: float = 0.5
    mask_outside: bool = False

    def __post_init__(self) -> None:
        if min(self.source_px, self.stride_px, self.abnormal_stride_px) < 1:
            raise ModelError(f"tile grid sizes must be positive, got {self}")
        if not 0 <= self.white_level <= 255:
            raise ModelError(f"white_level must be 0..255, got {self.white_level}")
        for name in ("background_max", "white_max", "abnormal_coverage"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ModelError(f"{name} must be in [0, 1], got {value}")


@dataclass(frozen=True)
class ModelCard:
    """The contents of ``model.json`` (see the module docstring and docs/inference.md for every field)."""

    architecture: str
    num_classes: int
    class_names: tuple[str, ...]
    nhead: int
    head_units: tuple[str, ...]
    preprocess: Preprocess
    tiling: TileGrid | None
    threshold: float = DEFAULT_THRESHOLD
    threshold_source: str = THRESHOLD_DEFAULT_SOURCE  # where the threshold came from (`set_threshold`)
    # which split chose it: "validation" (judged on test), "test" (chosen where judged: optimistic), "" (by hand or
    # the default)
    threshold_split: str = ""
    positive_class: str | None = "abnormal"
    run_id: str = ""
    round: int = 0
    hospital: int = 0
    dataset: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    written_at: str = ""
    intended_use: str = INTENDED_USE  # what the model may be used for (infra.provenance), on every card
    norm: str = "batch"  # the network's normalisation: "batch" or "group" (models.registry.to_group_norm)
    privacy: dict[str, Any] = field(default_factory=dict)  # DP training: epsilon, delta, parameters (issue 22)
    # every saved change of the threshold, oldest first: from, to, source, split, by, at, reason (`set_threshold`)
    threshold_history: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if is_timm_name(self.architecture):
            check_model_name(self.architecture)  # its form; the installed timm's having it, when it is built
        elif self.architecture not in MODEL_NAMES:
            raise ModelError(
                f"unknown architecture {self.architecture!r}: this version knows {', '.join(MODEL_NAMES)} "
                f"and {TIMM_PREFIX}<timm model name>"
            )
        if self.num_classes < 2 or len(self.class_names) != self.num_classes:
            raise ModelError(
                f"num_classes is {self.num_classes} but class_names lists {len(self.class_names)} "
                f"({list(self.class_names)}); they must agree and be at least 2"
            )
        if self.positive_class is not None and self.positive_class not in self.class_names:
            raise ModelError(f"positive_class {self.positive_class!r} is not one of {list(self.class_names)}")
        if set(self.class_names) == set(BINARY_CLASSES) and tuple(self.class_names) != BINARY_CLASSES:
            raise ModelError(
                f"class_names {list(self.class_names)}: a normal/abnormal model's outputs are "
                f"{list(BINARY_CLASSES)} in that order (output 1 is abnormal); a card that swaps them would call "
                "normal tissue abnormal"
            )
        if not (math.isfinite(self.threshold) and 0.0 < self.threshold < 1.0):
            raise ModelError(f"threshold must be strictly between 0 and 1, got {self.threshold}")
        if self.threshold_split not in ("", "validation", "test"):
            raise ModelError(f"threshold_split must be validation, test or empty, got {self.threshold_split!r}")
        if self.nhead < 0:
            raise ModelError(f"nhead must be >= 0, got {self.nhead}")
        problem = history_problem(
            self.threshold, self.threshold_source, self.threshold_split, list(self.threshold_history)
        )
        if problem is not None:
            raise ModelError(problem)

    @property
    def positive_index(self) -> int:
        """Index of the positive class (``abnormal``) in the model's outputs; `BundleError` for a card without one."""
        if self.positive_class is None:
            raise BundleError(
                f"the model's classes {list(self.class_names)} have no positive class: it decides by argmax"
            )
        return self.class_names.index(self.positive_class)

    @property
    def decision(self) -> str:
        """How the model calls a tile: ``threshold`` (``P(positive class) >= threshold``) or ``argmax``."""
        return "argmax" if self.positive_class is None else "threshold"

    def to_json(self) -> dict[str, Any]:
        """The card as written to ``model.json`` (strict JSON: no NaN)."""
        return {
            "format": CARD_FORMAT,
            "format_version": CARD_VERSION,
            "intended_use": self.intended_use,
            "weights": WEIGHTS_FILE,
            "architecture": self.architecture,
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
            "positive_class": self.positive_class,
            "nhead": self.nhead,
            "head_units": list(self.head_units),
            "preprocess": self.preprocess.to_json(),
            "tiling": None if self.tiling is None else asdict(self.tiling),
            "threshold": self.threshold,
            "threshold_source": self.threshold_source,
            **({"threshold_split": self.threshold_split} if self.threshold_split else {}),
            **({"threshold_history": [dict(h) for h in self.threshold_history]} if self.threshold_history else {}),
            **({"norm": self.norm} if self.norm != "batch" else {}),
            **({"privacy": self.privacy} if self.privacy else {}),
            **({"decision": self.decision} if self.positive_class is None else {}),
            "run_id": self.run_id,
            "round": self.round,
            "client": self.hospital,
            "dataset": self.dataset,
            "metrics": self.metrics,
            "written_at": self.written_at,
        }

    @classmethod
    def from_json(cls, data: Any, where: str = CARD_FILE) -> ModelCard:
        """Parse and check a card; `BundleError` naming ``where`` and the field for anything wrong."""
        if not isinstance(data, dict):
            raise BundleError(f"{where}: a model card is a JSON object, got {type(data).__name__}")
        if data.get("format") != CARD_FORMAT:
            raise BundleError(f"{where}: not a gastric-fl model card (format {data.get('format')!r})")
        if data.get("format_version") != CARD_VERSION:
            raise BundleError(
                f"{where}: card format_version {data.get('format_version')!r}, this version reads {CARD_VERSION}; "
                "export the model again with this version"
            )
        required = ("architecture", "num_classes", "class_names", "nhead", "preprocess", "threshold")
        missing = [k for k in required if k not in data]
        if missing:
            raise BundleError(f"{where}: the card lacks {missing}; export the model again")
        positive = data.get("positive_class", "abnormal")  # cards before multi-class runs: the binary task
        try:
            tiling = data.get("tiling")
            return cls(
                architecture=str(data["architecture"]),
                num_classes=int(data["num_classes"]),
                class_names=tuple(str(c) for c in data["class_names"]),
                nhead=int(data["nhead"]),
                head_units=tuple(str(u) for u in data.get("head_units", ())),
                preprocess=Preprocess.from_json(dict(data["preprocess"])),
                tiling=None if tiling is None else TileGrid(**tiling),
                threshold=float(data["threshold"]),
                threshold_source=str(data.get("threshold_source") or THRESHOLD_DEFAULT_SOURCE),
                threshold_split=str(data.get("threshold_split") or ""),
                positive_class=None if positive is None else str(positive),
                run_id=str(data.get("run_id", "")),
                round=int(data.get("round", 0)),
                hospital=int(data.get("client", 0)),
                dataset=dict(data.get("dataset") or {}),
                metrics=dict(data.get("metrics") or {}),
                written_at=str(data.get("written_at", "")),
                intended_use=str(data.get("intended_use") or INTENDED_USE),
                norm=str(data.get("norm") or "batch"),
                privacy=dict(data.get("privacy") or {}),
                threshold_history=_history(data.get("threshold_history"), where),
            )
        except ModelError as exc:
            raise BundleError(f"{where}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise BundleError(
                f"{where}: a field has the wrong type or is unknown ({exc}); export the model again"
            ) from None


@dataclass
class Bundle:
    """A checked bundle: its folder, its card, and the model with its weights loaded, in eval mode."""

    folder: Path
    card: ModelCard
    model: nn.Module
    # the hospital's description of its own tissue (models.shift), None for a bundle without one (`tissue_state`)
    tissue: TissueDescription | None = None
    tissue_note: str = ""  # why there is none, in words, when there is none


def tissue_state(folder: Path, card: ModelCard) -> tuple[TissueDescription | None, str]:
    """The bundle's tissue description (`models.shift`) and, when it has none or none for these weights, why, in
    words (`models.decision.NO_DESCRIPTION` and the reason); never raises."""
    try:
        description = read_description(folder)
    except TissueError as exc:
        return None, f"{NO_DESCRIPTION} ({exc})"
    if description is None:
        return None, f"{NO_DESCRIPTION} (the bundle holds no {TISSUE_FILE}: exported by an older version)"
    if card.round and description.round != card.round:
        return None, (
            f"{NO_DESCRIPTION} ({TISSUE_FILE} describes round {description.round}, the weights are of round "
            f"{card.round}: the bundle is being rewritten; try again when it is done)"
        )
    return description, ""


def write_bundle(folder: Path, card: ModelCard, state: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``folder/model.json`` (and ``model.safetensors`` from ``state`` when given), each atomically.

    The weights go first and carry the card's round in their metadata, so `load_bundle` notices a card and
    weights from different rounds (a reader that came between the two replacements). Returns the card's path.
    """
    folder.mkdir(parents=True, exist_ok=True)
    if state is not None:
        tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        with atomic_target(folder / WEIGHTS_FILE) as tmp:
            save_file(tensors, str(tmp), metadata={"round": str(card.round)})
    path = folder / CARD_FILE
    write_atomic(path, (json.dumps(card.to_json(), indent=2, allow_nan=False) + "\n").encode("utf-8"))
    return path


def set_threshold(
    path: Path,
    threshold: float,
    source: str,
    metrics: dict[str, Any] | None = None,
    split: str = "",
    *,
    by: str = "",
    reason: str = "",
) -> ModelCard:
    """Save ``threshold`` as the bundle's operating threshold: ``model.json`` is rewritten atomically with it, with
    ``threshold_source`` (where it came from, in words: "set by hand", "reaches sensitivity 0.90 on the test
    split") and, when given, the card's ``metrics`` at the new threshold; the weights are not touched. The change
    is appended to ``threshold_history`` (from, to, source, split, ``by`` whom, at what time, ``reason``) and
    ``written_at`` is the time of the change. Every place that calls tiles or slides with this bundle (``predict``,
    the Slide page, the HTML report) then uses it. `BundleError` for a card that cannot be read, or a threshold not
    strictly between 0 and 1; a model that decides by argmax has no threshold to set."""
    folder = bundle_folder(path)
    card = read_card(folder)
    if card.positive_class is None:
        raise BundleError(f"{folder / CARD_FILE}: the model decides by argmax, it has no threshold to set")
    if (folder / WEIGHTS_FILE).is_file():  # a threshold describes these weights: they must be the card's round
        check_round(folder / WEIGHTS_FILE, card)
    if not source.strip():
        raise BundleError("say where the threshold comes from (for example: set by hand)")
    for name, text, limit in (("by", by, MAX_BY), ("reason", reason, MAX_REASON), ("source", source, MAX_SOURCE)):
        problem = note_problem(name, text.strip(), limit)
        if problem is not None:
            raise BundleError(f"{problem}; the card was not changed")
    at = datetime.now(UTC).isoformat(timespec="seconds")
    change = {
        "from": card.threshold,
        "to": float(threshold),
        "source": source.strip(),
        "split": split,
        "by": by.strip(),
        "at": at,
        "reason": reason.strip(),
    }
    try:
        updated = replace(
            card,
            threshold=float(threshold),
            threshold_source=source.strip(),
            threshold_split=split,
            metrics=card.metrics if metrics is None else dict(metrics),
            written_at=at,
            threshold_history=(*card.threshold_history, change),
        )
    except ModelError as exc:
        raise BundleError(f"{folder / CARD_FILE}: {exc}") from None
    write_bundle(folder, updated)
    return updated


def _history(raw: Any, where: str) -> tuple[dict[str, Any], ...]:
    """The card's ``threshold_history`` as read (its entries are checked by `history_problem`); anything but a list
    is a `BundleError` naming ``where``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BundleError(f"{where}: threshold_history is a {type(raw).__name__}, not a list of changes: {EDITED}")
    return tuple(raw)


def bundle_folder(path: Path) -> Path:
    """The bundle folder ``path`` names: itself, or the folder of its ``model.json`` or ``model.safetensors``."""
    return path.parent if path.name in (CARD_FILE, WEIGHTS_FILE) and not path.is_dir() else path


def read_card(path: Path) -> ModelCard:
    """The checked card of the bundle at ``path`` (a bundle folder or its ``model.json``)."""
    folder = bundle_folder(path)
    if not folder.is_dir():
        raise BundleError(
            f"model bundle {path} does not exist: give a hospital folder of a run, e.g. <run>/hospitals/client_00"
        )
    card_path = folder / CARD_FILE
    if not card_path.is_file():
        raise BundleError(
            f"{folder} holds no {CARD_FILE}: it is not a model bundle (runs trained by this version write one per "
            "hospital after each evaluated round; train again or point --model at <run>/hospitals/client_XX)"
        )
    try:
        data = json.loads(card_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{card_path} is not readable JSON ({exc}); export the model again") from None
    return ModelCard.from_json(data, str(card_path))


def _check_finite(tensors: dict[str, torch.Tensor], keys: list[str], weights_path: Path) -> None:
    """`BundleError` naming the first tensor (in ``keys`` order: the model's) with NaN or infinite values, and how
    many tensors have them."""
    bad = [
        (key, int((~torch.isfinite(tensors[key])).sum()))
        for key in keys
        if tensors[key].is_floating_point() and not bool(torch.isfinite(tensors[key]).all())
    ]
    if bad:
        key, count = bad[0]
        more = f" ({len(bad)} tensors in all)" if len(bad) > 1 else ""
        raise BundleError(
            f"{weights_path}: {key} holds {count} NaN or infinite value(s){more}, so the model cannot score a slide; "
            "the training diverged or the file is damaged: export the model from a run that trained normally "
            "(e.g. with a lower learning rate)"
        )


def check_round(weights_path: Path, card: ModelCard) -> None:
    """`BundleError` (one line) when the weights' metadata (read alone, no tensor) names another round than the
    card, or the file is not a readable safetensors file."""
    try:
        with safe_open(str(weights_path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise BundleError(
            f"{weights_path} is not a readable safetensors file ({exc}); export the model again"
        ) from None
    if "round" in metadata and card.round and metadata["round"] != str(card.round):
        raise BundleError(
            f"{weights_path} is from round {metadata['round']} but {CARD_FILE} describes round {card.round}: the "
            "bundle is being rewritten (the run is still training) or was mixed by hand; try again when it is done"
        )


def load_bundle(path: Path, device: torch.device | str = "cpu") -> Bundle:
    """Read and check the bundle at ``path``: the card, then weights that fit its architecture key for key.

    `BundleError` (one line) for a missing folder or file, a damaged or unknown card, an architecture this version
    does not know, weights missing keys, holding extra keys or tensors of another shape, weights holding NaN or
    infinite values (a model that diverged, or a damaged file: it would score every tile NaN or at random), or
    weights from another round than the card.
    """
    folder = bundle_folder(path)
    card = read_card(path)
    weights_path = folder / WEIGHTS_FILE
    if not weights_path.is_file():
        raise BundleError(f"{folder} has a card but no {WEIGHTS_FILE}; export the model again")
    check_round(weights_path, card)
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise BundleError(
            f"{weights_path} is not a readable safetensors file ({exc}); export the model again"
        ) from None
    try:
        model = create_model(card.architecture, card.num_classes, card.preprocess.in_chans, norm=card.norm)
    except ModelError as exc:  # e.g. a timm architecture the installed timm does not have
        raise BundleError(f"{folder}: {exc}") from None
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    extra = sorted(set(tensors) - set(own))
    if missing or extra:
        raise BundleError(
            f"{weights_path} does not fit {card.architecture} with {card.num_classes} classes and "
            f"{card.preprocess.in_chans} input channel(s): {len(missing)} key(s) missing (e.g. {missing[:2]}), "
            f"{len(extra)} unexpected (e.g. {extra[:2]})"
        )
    wrong = [k for k in own if tuple(own[k].shape) != tuple(tensors[k].shape)]
    if wrong:
        key = wrong[0]
        raise BundleError(
            f"{weights_path} does not fit {card.architecture}: {key} has shape {tuple(tensors[key].shape)}, "
            f"the card's architecture needs {tuple(own[key].shape)} ({len(wrong)} tensor(s) differ)"
        )
    _check_finite(tensors, list(own), weights_path)
    model.load_state_dict(tensors)
    model.to(device).eval()
    tissue, note = tissue_state(folder, card)
    return Bundle(folder=folder, card=card, model=model, tissue=tissue, tissue_note=note)
