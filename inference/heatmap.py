"""The probability heatmap over a slide, and the ground-truth outline (issue 12, part 2).

Each pixel covered by scored tiles shows the mean ``P(abnormal)`` of the tiles covering it (tiles overlap when the
grid's stride is below the tile size), coloured with *viridis* (perceptually uniform and readable with red-green
colour blindness: dark purple = 0, yellow = 1), blended half-and-half over the slide, where that mean is at least
the decision threshold; below it (and where no tile covers the slide: background, glass) the slide shows unchanged,
so the tissue stays readable and the colour marks only what the model calls abnormal (`visible`). The annotation,
when known, is outlined in white on black so that it stands out on both ends of the colormap.

The overlay has the slide's size, unless the slide's longer side exceeds ``max_side``: then slide, map and outline
are downscaled by ``scale = max_side / longer side`` (recorded in ``summary.json``).
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

from pipeline.images import RGBImage
from pipeline.tile_maps import coverage_maps, probability_map, visible

COLORMAP = "viridis"
ALPHA = 0.5
# unfamiliar tissue (models.shift) is hatched: grey diagonal stripes HATCH_WIDTH of every HATCH_PERIOD pixels
HATCH_GREY = (128, 128, 128)
HATCH_PERIOD = 8
HATCH_WIDTH = 3
UNFAMILIAR_MARK = "grey diagonal hatching: tissue unlike this hospital's (unfamiliar), whatever its probability"


def hatch(image: RGBImage, region: npt.NDArray[np.bool_]) -> RGBImage:
    """``image`` with grey diagonal stripes over ``region`` (unfamiliar tissue: it reads as neither colour of the
    probability scale, and the tissue still shows between the stripes)."""
    height, width = region.shape
    rows, cols = np.indices((height, width))
    stripes = ((rows + cols) % HATCH_PERIOD) < HATCH_WIDTH
    out = image.copy()
    out[region & stripes] = HATCH_GREY
    return out


def render_overlay(
    image: RGBImage,
    xs: npt.NDArray[np.int64],
    ys: npt.NDArray[np.int64],
    size: int,
    probability: npt.NDArray[np.float64],
    cancer: npt.NDArray[np.bool_] | None,
    max_side: int,
    threshold: float | None = None,
    unfamiliar: npt.NDArray[np.bool_] | None = None,
) -> tuple[RGBImage, float]:
    """The overlay (RGB ``uint8``) and the scale it was drawn at (1.0: the slide's own size); colour only where
    the mean probability reaches ``threshold`` (`visible`); tissue under a tile marked ``unfamiliar`` hatched grey
    (`hatch`)."""
    height, width = image.shape[:2]
    scale = min(1.0, max_side / max(height, width))
    size_out = (max(1, round(width * scale)), max(1, round(height * scale)))
    base = image if scale == 1.0 else cv2.resize(image, size_out, interpolation=cv2.INTER_AREA)
    mean, covered = probability_map(xs, ys, size, probability, (height, width), scale)
    levels = np.clip(np.rint(mean * 255.0), 0, 255).astype(np.uint8)
    colours = cv2.cvtColor(cv2.applyColorMap(levels, cv2.COLORMAP_VIRIDIS), cv2.COLOR_BGR2RGB)
    blended = cv2.addWeighted(base, 1.0 - ALPHA, colours, ALPHA, 0.0)
    out = np.where(visible(mean, covered, threshold)[:, :, None], blended, base).astype(np.uint8)
    if unfamiliar is not None and unfamiliar.any():
        _, strange = coverage_maps(xs, ys, size, unfamiliar, (height, width), scale)
        out = hatch(out, strange)
    if cancer is not None and cancer.any():
        region: npt.NDArray[np.uint8] = cancer.astype(np.uint8)
        if scale != 1.0:
            region = np.asarray(cv2.resize(region, size_out, interpolation=cv2.INTER_NEAREST), dtype=np.uint8)
        contours, _ = cv2.findContours(region, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        thickness = max(1, round(max(size_out) / 400))
        cv2.drawContours(out, contours, -1, (0, 0, 0), 2 * thickness + 1)
        cv2.drawContours(out, contours, -1, (255, 255, 255), thickness)
    return np.ascontiguousarray(out), scale
