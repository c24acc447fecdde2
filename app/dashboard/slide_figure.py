"""The Slide page's heatmap figure: the slide, the heatmap of P(abnormal) at an opacity and the annotation's outline
as image layers in slide pixels (`app.slide_view.ScoredSlide.layer`), the tiles as invisible clickable points that
carry the hover text and the colour bar (`app.colour_scale`: the overlay's own viridis from the threshold up), and the
picked tile framed."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import slide_view

CHART_HEIGHT = 490


def file_stamp(path: Path) -> float:
    """A file's modification time (0 when it is missing): the version a cached reading of it is kept under."""
    return path.stat().st_mtime if path.exists() else 0.0


@st.cache_data(show_spinner=False, max_entries=64)
def _data_uri(path: str, stamp: float) -> str:
    """A PNG file as a data URI (cached per file version: ``stamp`` is its modification time)."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _threshold_scale(threshold: float) -> list[list[Any]]:
    """The colour bar's scale: below ``threshold`` the heatmap leaves the tissue uncoloured (shown light grey on
    the bar), from it up the overlay's own viridis of P (`app.colour_scale.plotly_scale`: the same colour for the
    same P on the bar and the heatmap)."""
    from app import colour_scale

    return colour_scale.plotly_scale(threshold)


def _bar_ticks(threshold: float) -> tuple[list[float], list[str]]:
    """The colour bar's ticks: 0, 0.5 and 1, and the threshold marked with ▲; a round tick too close to the
    threshold to be read beside it on a phone's width is left out."""
    t = round(min(max(threshold, 0.0), 1.0), 2)
    values = sorted({t, *(v for v in (0.0, 0.5, 1.0) if abs(v - t) >= 0.15)})
    return values, [f"▲{v:.2f}" if v == t else f"{v:g}" for v in values]


def heatmap_figure(scored: slide_view.ScoredSlide, opacity: float, picked: int) -> go.Figure:
    """Slide, heatmap (at ``opacity``) and outline as image layers in slide pixels, tiles as clickable points."""
    step = 1.0 / scored.scale
    fig = go.Figure()
    for name in ("slide", "heat", "unfamiliar", "outline"):  # unfamiliar: tissue unlike the hospital's, hatched
        layer = scored.layer(name)
        if layer is None:
            continue
        fig.add_trace(
            go.Image(
                source=_data_uri(str(layer), file_stamp(layer)),
                x0=0,
                y0=0,
                dx=step,
                dy=step,
                opacity=opacity if name == "heat" else 1.0,
                hoverinfo="skip",
                name=name,
            )
        )
    half = scored.size / 2
    # Invisible squares over the tile centres carry the hover text, the colour bar and the click (Streamlit's
    # point selection); the heatmap layer above is what the eye sees.
    marker_px = max(6.0, min(48.0, scored.size * CHART_HEIGHT / max(scored.width, scored.height) * 0.9))
    tickvals, ticktext = _bar_ticks(scored.threshold)
    fig.add_trace(
        go.Scatter(
            x=scored.xs + half,
            y=scored.ys + half,
            mode="markers",
            customdata=np.arange(len(scored.xs)),
            marker={
                "symbol": "square",
                "size": marker_px,
                "color": scored.probability,
                "colorscale": _threshold_scale(scored.threshold),
                "cmin": 0.0,
                "cmax": 1.0,
                "opacity": 0.0,
                "showscale": True,
                # A short title above the bar and three ticks besides the threshold's, so that nothing is cut
                # at any width; what the grey means is said in the caption under the chart.
                "colorbar": {
                    "title": {"text": "P(abnormal)", "side": "top", "font": {"size": 13}},
                    "tickvals": tickvals,
                    "ticktext": ticktext,
                    "tickfont": {"size": 13},
                    "orientation": "h",
                    "thickness": 12,
                    "x": 0.5,
                    "xanchor": "center",
                    "y": -0.02,
                    "yanchor": "top",
                    "len": 0.8,
                },
            },
            selected={"marker": {"opacity": 0.0}},
            unselected={"marker": {"opacity": 0.0}},
            hovertemplate="%{text}<extra></extra>",
            text=[
                f"x {x}, y {y}: P(abnormal) {p:.3f}"
                for x, y, p in zip(scored.xs, scored.ys, scored.probability, strict=True)
            ],
            name="tiles",
        )
    )
    x, y = int(scored.xs[picked]), int(scored.ys[picked])
    for colour, width in (("black", 5), ("white", 2)):
        fig.add_shape(type="rect", x0=x, y0=y, x1=x + scored.size, y1=y + scored.size,
                      line={"color": colour, "width": width})  # fmt: skip
    fig.update_xaxes(range=[0, scored.width], visible=False, constrain="domain")
    fig.update_yaxes(range=[scored.height, 0], visible=False, scaleanchor="x")
    fig.update_layout(
        height=CHART_HEIGHT,
        margin={"l": 0, "r": 0, "t": 28, "b": 72},
        clickmode="event+select",
        dragmode="pan",
        showlegend=False,
    )
    return fig
