"""Maps of a slide's tiles: which pixels a grid of square tiles covers, and the mean of a per-tile value under
each pixel (issue 12, part 2; issue 47, item 3: one rule for `predict`'s overlay, the HTML report and the Slide
page's heatmap of either grid).

Numpy only, so that a page that draws an already scored slide does not load torch (`inference` does).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def _span(start: npt.NDArray[np.int64], size: int, scale: float, limit: int) -> tuple[np.ndarray, np.ndarray]:
    lo = np.clip(np.floor(start * scale).astype(np.int64), 0, limit)
    hi = np.clip(np.ceil((start + size) * scale).astype(np.int64), 0, limit)
    return lo, np.maximum(hi, np.minimum(lo + 1, limit))


def coverage_maps(
    xs: npt.NDArray[np.int64],
    ys: npt.NDArray[np.int64],
    size: int,
    called: npt.NDArray[np.bool_],
    shape: tuple[int, int],
    scale: float,
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """``(covered, called)`` boolean maps of the slide scaled by ``scale``: pixels under any tile, and under a tile
    called abnormal (the union of their squares)."""
    height, width = max(1, round(shape[0] * scale)), max(1, round(shape[1] * scale))
    covered = np.zeros((height, width), dtype=bool)
    positive = np.zeros((height, width), dtype=bool)
    x0, x1 = _span(xs, size, scale, width)
    y0, y1 = _span(ys, size, scale, height)
    for k in range(len(xs)):
        covered[y0[k] : y1[k], x0[k] : x1[k]] = True
        if called[k]:
            positive[y0[k] : y1[k], x0[k] : x1[k]] = True
    return covered, positive


def probability_map(
    xs: npt.NDArray[np.int64],
    ys: npt.NDArray[np.int64],
    size: int,
    probability: npt.NDArray[np.float64],
    shape: tuple[int, int],
    scale: float,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """Mean probability of the tiles covering each pixel of the scaled slide, and where any tile covers it."""
    height, width = max(1, round(shape[0] * scale)), max(1, round(shape[1] * scale))
    total = np.zeros((height, width), dtype=np.float64)
    count = np.zeros((height, width), dtype=np.int32)
    x0, x1 = _span(xs, size, scale, width)
    y0, y1 = _span(ys, size, scale, height)
    for k in range(len(xs)):
        total[y0[k] : y1[k], x0[k] : x1[k]] += probability[k]
        count[y0[k] : y1[k], x0[k] : x1[k]] += 1
    covered = count > 0
    mean = np.zeros_like(total)
    mean[covered] = total[covered] / count[covered]
    return mean, covered


def visible(
    mean: npt.NDArray[np.float64], covered: npt.NDArray[np.bool_], threshold: float | None
) -> npt.NDArray[np.bool_]:
    """Where the heatmap is drawn: pixels under a tile whose mean probability is at least ``threshold`` (every
    covered pixel when ``threshold`` is ``None``)."""
    return covered if threshold is None else covered & (mean >= threshold)
