"""The hospital's description of its own tissue, written into its bundle at each export (issue 47, part 1).

`describe_tissue` passes the hospital's training and validation tiles (as evaluated: no augmentation) through the
model being exported up to its first layer unit (`models.features`) and fits the description (`models.shift`,
version 2: mean and Ledoit-Wolf covariance of the layer's channel statistics and the input's scale ratios, a
Mahalanobis threshold calibrated on out-of-fold distances by slide), written as ``tissue.safetensors`` beside
``model.safetensors``.

It stays at the hospital: the file is written in the hospital's own folder by its own process, no message of the
contract (`federation.wire.contract`) has a field for it, and the outbound log records only what replies carry
(tests/federation/engine/test_tissue_boundary.py checks both).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from federation.hospital.data import HospitalData, to_tensor
from models.decision import slides_of_tiles
from models.errors import ModelError
from models.features import description_layer, tile_statistics
from models.names import TISSUE_FILE
from models.shift import TISSUE_VERSION, fit_description, write_description

BATCH = 256


def describe_tissue(model: nn.Module, data: HospitalData, folder: Path, server_round: int) -> Path | None:
    """Fit and write the description of ``data``'s training and validation tiles for ``model``; ``None`` (nothing
    written, an older description removed so that none describes other weights) when the hospital has too few
    tiles, the model's statistics are not finite or its architecture has no layer units to read (the bundle then
    says it has no description; the export itself never fails for want of one)."""
    images = [data.train_x] + ([data.val_x] if data.val_x is not None and data.num_val else [])
    x = np.concatenate(images)
    train_slides = list(data.train_units) if data.train_units is not None else None
    val_slides = slides_of_tiles(data.val_paths) if data.num_val else []
    if train_slides is None or val_slides is None:  # tile names that do not say their slide: one tile, one group
        slides = [f"tile{i}" for i in range(len(x))]
    else:
        slides = [f"train:{s}" for s in train_slides] + [f"val:{s}" for s in val_slides]
    device = next(model.parameters()).device
    try:
        layer = description_layer(model)
        batches = (to_tensor(x[i : i + BATCH], device) for i in range(0, len(x), BATCH))
        features = tile_statistics(model, layer, batches, scale=True)  # the current version's (models.shift)
        description = fit_description(features, slides, layer, round=server_round, version=TISSUE_VERSION)
    except ModelError:  # TissueError included: too few tiles, a diverged model, an architecture without units
        (folder / TISSUE_FILE).unlink(missing_ok=True)
        return None
    return write_description(folder, description)
