"""One colour scale for P(abnormal), the same on the heatmap overlay, its colour bar and the caption that names it
(issue 47, item 5), in the dashboard's Slide page and in the HTML report.

The overlay colours a pixel by *viridis of P itself* (OpenCV's ``COLORMAP_VIRIDIS`` at level round(255 P),
`inference.heatmap.overlay` and `app.slide_view`'s heat layer), and only where P reaches the threshold. The bar is
drawn from the same lookup table (`viridis_rgb`), from the threshold up, never rescaled to start at its dark end:
a tile at P 0.6 has viridis(0.6) on the overlay and at 0.6 on the bar, whatever the threshold. Below the threshold
the bar is light grey (the overlay leaves the tissue uncoloured). `words` names the colours at the threshold and at
1, so the caption says what the bar shows. Viridis (van der Walt & Smith, matplotlib 2015) is perceptually uniform
and readable with red-green colour blindness.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

BELOW = (225, 225, 225)  # the bar's colour below the threshold, where the overlay leaves the tissue uncoloured

# Viridis' hues along P, named for the caption: (upper end of P, name)
_NAMES = ((0.15, "dark purple"), (0.35, "blue"), (0.62, "teal"), (0.85, "green"), (1.01, "yellow"))


def viridis_rgb(values: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """RGB (``uint8``, one row per value) of each P in ``values``: OpenCV's viridis at level round(255 P), exactly
    what the overlay paints for that P."""
    p = np.asarray(values, dtype=np.float64).ravel()
    levels = np.clip(np.rint(p * 255.0), 0, 255).astype(np.uint8)
    rgb = cv2.cvtColor(cv2.applyColorMap(levels[:, None], cv2.COLORMAP_VIRIDIS), cv2.COLOR_BGR2RGB)
    return np.asarray(rgb, dtype=np.uint8).reshape(-1, 3)


def bar_levels(threshold: float) -> npt.NDArray[np.float64]:
    """The P of every lookup-table level from ``threshold`` to 1 (the threshold itself first): where the bar's
    colours are pinned, so that between two of them it is never off by more than one level."""
    t = min(max(float(threshold), 0.0), 1.0)
    first = int(np.ceil(t * 255.0 - 1e-9))
    return np.unique(np.concatenate([[t], np.arange(first, 256) / 255.0]))


def plotly_scale(threshold: float) -> list[list[object]]:
    """The bar as a Plotly colorscale over P in [0, 1]: light grey up to ``threshold``, then `viridis_rgb` at
    every level (`bar_levels`)."""
    t = min(max(float(threshold), 0.0), 1.0)
    grey = "rgb({},{},{})".format(*BELOW)
    scale: list[list[object]] = [[0.0, grey], [t, grey]] if t > 0 else []
    stops = bar_levels(t)
    for stop, (r, g, b) in zip(stops, viridis_rgb(stops), strict=True):
        scale.append([float(stop), f"rgb({r},{g},{b})"])
    return scale


def colour_name(value: float) -> str:
    """Viridis' hue at P ``value`` in words (dark purple, blue, teal, green, yellow)."""
    return next(name for upper, name in _NAMES if value < upper)


def words(threshold: float) -> str:
    """The scale in words for a caption: ``"viridis of P itself, as on the bar: teal at the threshold 0.50, yellow
    at 1"``."""
    return f"viridis of P itself, as on the bar: {colour_name(threshold)} at the threshold {threshold:.2f}, yellow at 1"
