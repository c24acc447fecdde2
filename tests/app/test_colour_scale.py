"""One colour scale (issue 47, item 5): the colour bar and the overlay give the same P the same colour, in the
dashboard (the Slide page's bar and heat layer) and in the HTML report (its bar and predict's overlay), and the
caption names the colour the bar starts with."""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from app import colour_scale, slide_view
from app.report_html.figures import bar_strip
from inference.heatmap import render_overlay

THRESHOLD = 0.5


def _png(data: bytes) -> npt.NDArray[np.uint8]:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None
    return np.asarray(image, dtype=np.uint8)


PROBABILITIES = (0.5, 0.6, 0.8, 0.97)  # a tile at 0.6 is the case: the rescaled bar read it as 0.8


def _bar_colour(p: float) -> tuple[int, int, int]:
    """The report bar's colour at P ``p`` (its strip holds one colour per lookup-table level from the threshold)."""
    levels = colour_scale.bar_levels(THRESHOLD)
    (index,) = np.flatnonzero(np.isclose(levels, round(p * 255) / 255))
    return tuple(int(v) for v in bar_strip(THRESHOLD)[index])  # type: ignore[return-value]


def _plotly_colour(p: float) -> str:
    scale = colour_scale.plotly_scale(THRESHOLD)
    (colour,) = [
        c for stop, c in scale if np.isclose(float(str(stop)), round(p * 255) / 255) and c != "rgb(225,225,225)"
    ]
    return str(colour)


@pytest.mark.parametrize("p", PROBABILITIES)
def test_the_reports_bar_and_predicts_overlay_give_a_tile_the_same_colour(p: float) -> None:
    """The overlay blends its colour half and half into the slide: over a slide painted in the bar's colour for P,
    a tile at P leaves the pixel as it was only if the overlay paints that same colour."""
    colour = _bar_colour(p)
    image = np.full((64, 64, 3), colour, dtype=np.uint8)
    xs, ys = np.array([0]), np.array([0])
    drawn, scale = render_overlay(image, xs, ys, 64, np.array([p]), None, 64, THRESHOLD)
    assert scale == 1.0
    assert tuple(int(v) for v in drawn[32, 32]) == colour
    # the bar is not rescaled to the threshold: at P 0.6 it is viridis(0.6), not viridis(0.2)
    rescaled = tuple(int(v) for v in colour_scale.viridis_rgb([(p - THRESHOLD) / (1 - THRESHOLD)])[0])
    assert p == THRESHOLD or rescaled != colour


@pytest.mark.parametrize("p", PROBABILITIES)
def test_the_dashboards_bar_and_heat_layer_give_a_tile_the_same_colour(p: float) -> None:
    mean = np.full((8, 8), p)
    layers = slide_view._layers(np.zeros((8, 8, 3), np.uint8), None, mean, np.ones((8, 8), bool), 1.0, THRESHOLD)
    heat = cv2.cvtColor(_png(layers["heat.png"]), cv2.COLOR_BGRA2RGBA)
    r, g, b, alpha = (int(v) for v in heat[4, 4])
    assert alpha == 255  # at or above the threshold: coloured
    assert _plotly_colour(p) == f"rgb({r},{g},{b})" == "rgb({},{},{})".format(*_bar_colour(p))


def test_below_the_threshold_the_bar_is_grey_and_the_caption_names_the_colour_it_starts_with() -> None:
    scale = colour_scale.plotly_scale(THRESHOLD)
    assert scale[:2] == [[0.0, "rgb(225,225,225)"], [0.5, "rgb(225,225,225)"]]
    start = colour_scale.viridis_rgb([THRESHOLD])[0]
    assert scale[2] == [0.5, "rgb({},{},{})".format(*start)]  # the threshold's own colour, teal: not dark purple
    assert (
        colour_scale.words(THRESHOLD) == "viridis of P itself, as on the bar: teal at the threshold 0.50, yellow at 1"
    )
    assert colour_scale.words(0.1).startswith("viridis of P itself, as on the bar: dark purple at the threshold 0.10")
    mean = np.full((4, 4), 0.3)
    layers = slide_view._layers(np.zeros((4, 4, 3), np.uint8), None, mean, np.ones((4, 4), bool), 1.0, THRESHOLD)
    heat = _png(layers["heat.png"])
    assert int(heat[2, 2, 3]) == 0  # below the threshold: uncoloured
