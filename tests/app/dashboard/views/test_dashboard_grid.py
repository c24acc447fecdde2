"""Compare's ablation grid view: the nhead x dm heatmap labels each cell in a colour that reads on it (WCAG AA,
4.5:1, measured against the cell's own viridis colour, since axe-core cannot measure text drawn in SVG), a cell
without a run says so, and the page (``?compare=grid``) draws the grid's table and heatmap."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plotly.colors import sample_colorscale
from support.dashboard import Fixture, open_page

from app.dashboard import charts

AA = 4.5


def _cell_colours(fig: go.Figure) -> dict[tuple[str, str], str]:
    """Each finite cell's viridis colour, as plotly maps its value between the trace's zmin and zmax."""
    trace = fig.data[0]
    z = np.asarray(trace.z, dtype=float)
    colours = {}
    for i, row in enumerate(trace.y):
        for j, column in enumerate(trace.x):
            if np.isfinite(z[i, j]):
                share = (z[i, j] - trace.zmin) / (trace.zmax - trace.zmin)
                colours[(str(column), str(row))] = sample_colorscale("Viridis", [share])[0]
    return colours


def test_every_cell_label_reaches_aa_contrast_on_its_own_colour() -> None:
    # the whole viridis range: dark purple, blue, teal, green and yellow cells, and one cell with no run
    values = np.linspace(0.30, 0.90, 12)
    table = pd.DataFrame(values.reshape(3, 4), index=[0, 2, 6], columns=["manhattan", "euclidean", "cosine", "l4"])
    table.iloc[1, 2] = np.nan
    fig = charts.grid_heatmap(table, "Best ACC by nhead and distance dm")
    colours = _cell_colours(fig)
    # labels sit at category positions (column j, row i): a row named "6" would otherwise be read as position 6,
    # off the chart
    xs, ys = list(fig.data[0].x), list(fig.data[0].y)
    assert {(a.x, a.y) for a in fig.layout.annotations} == {(j, i) for j in range(4) for i in range(3)}
    labels = {(xs[a.x], ys[a.y]): a for a in fig.layout.annotations}
    assert len(labels) == 12
    assert len(colours) == 11  # every cell but the one with no run
    ratios = []
    for (column, row), cell in colours.items():
        label = labels[(column, row)]
        assert label.text == f"{table.loc[int(row), column]:.3f}"
        ratio = charts.contrast_ratio(charts._rgb(cell), charts._rgb(label.font.color))
        ratios.append(ratio)
        assert ratio >= AA, (column, row, cell, label.font.color, ratio)
    assert labels[("cosine", "2")].text == "no run"
    assert {labels[k].font.color for k in colours} == {"#000000", "#ffffff"}  # both are needed over viridis
    assert min(ratios) >= AA


def test_white_on_mid_viridis_would_fail_so_the_label_colour_is_chosen_per_cell() -> None:
    teal = sample_colorscale("Viridis", [0.5])[0]
    assert charts.contrast_ratio(charts._rgb(teal), (255, 255, 255)) < AA  # one colour for all cells is not enough
    assert charts.text_colour(teal) == "#000000"
    assert charts.text_colour(sample_colorscale("Viridis", [0.0])[0]) == "#ffffff"
    assert charts.contrast_ratio((0, 0, 0), (255, 255, 255)) == pytest.approx(21.0)


def test_the_grid_view_draws_the_grid_and_its_labelled_heatmap(fixture_root: Fixture) -> None:
    at = open_page("compare", {"compare_mode": "Ablation grid"})
    assert at.selectbox(key="grid").value.name == "grid-demo"
    chart = next(c for c in at.get("plotly_chart") if "nhead and distance dm" in c.proto.spec)
    spec = json.loads(chart.proto.spec)
    texts = sorted(a["text"] for a in spec["layout"]["annotations"])
    # Best averaged ACC: 0.75 x the fixture's scale 0.5 + 0.1 nhead (+0.05 for euclidean)
    assert texts == ["0.375", "0.413", "0.525", "0.562"]
    assert "texttemplate" not in spec["data"][0]  # no second, one-colour set of labels under them
