"""Plotly figures for the dashboard: per-hospital curves, averaged +/- std curves (FedSAF paper Fig. 4-5),
values transmitted, the AMP attention matrix xi (Eq. 16-18), ROC curves, confusion matrices and grid heatmaps.

Each function takes already-shaped data (see ``runs`` and ``evaluation``) and returns a figure; no file access.

Colours are the Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008), which stays distinguishable with
the common colour-vision deficiencies; a hospital keeps one colour on every page (`hospital_colour`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from app.datasets import hospital_label
from app.evaluation.metrics import Roc

# Okabe-Ito: blue, orange, bluish green, reddish purple, sky blue, vermillion, yellow, black.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
ACCENT = "#0072B2"  # one-series figures: the averaged curves
ACCENT_BAND = "rgba(0,114,178,0.15)"
MUTED = "#6b7280"  # reference lines (chance diagonal, std)
_HOSPITAL = re.compile(r"^Hospital (\d+)$")


def hospital_colour(hospital: int) -> str:
    """The colour of hospital ``hospital`` on every chart (Okabe-Ito, by hospital index, cycling after eight)."""
    return PALETTE[int(hospital) % len(PALETTE)]


def series_colour(name: str, position: int) -> str:
    """A hospital's own colour for a series named like ``Hospital 2``; else the palette colour at ``position``."""
    match = _HOSPITAL.match(name)
    return hospital_colour(int(match.group(1))) if match else PALETTE[position % len(PALETTE)]


def _layout(fig: go.Figure, title: str, y_title: str = "", height: int = 360, x_title: str = "round") -> go.Figure:
    # No Plotly template: st.plotly_chart applies Streamlit's theme, and setting one costs more than building the
    # figure (benchmarks/dashboard_refresh.py), every 2 s while a run is watched.
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left", "font": {"size": 15}},
        height=height,
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        # Legend under the plot: above it, long run names collide with the title.
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0},
        xaxis_title=x_title,
        yaxis_title=y_title,
    )
    return fig


def per_hospital(table: pd.DataFrame, title: str, y_title: str, unit_range: bool = True) -> go.Figure:
    """One line per hospital (columns of ``table``, e.g. ``Hospital 0``: each in its own colour) over rounds (its
    index); other columns take the palette in order."""
    fig = go.Figure()
    for i, column in enumerate(table.columns):
        fig.add_trace(
            go.Scatter(
                x=table.index,
                y=table[column],
                mode="lines+markers",
                name=str(column),
                line={"color": series_colour(str(column), i), "width": 2},
                connectgaps=False,
            )
        )
    if unit_range:
        fig.update_yaxes(range=[0, 1.02])
    fig.update_xaxes(dtick=1 if len(table.index) <= 20 else None)
    return _layout(fig, title, y_title)


def mean_std(rounds: pd.DataFrame, prefix: str, title: str, y_title: str) -> go.Figure:
    """The averaged curve with a +/- std band (``<prefix>_mean``/``<prefix>_std`` columns of ``runs.per_round``)."""
    x = rounds["round"].to_numpy()
    mean = rounds[f"{prefix}_mean"].to_numpy(dtype=float)
    std = np.nan_to_num(rounds[f"{prefix}_std"].to_numpy(dtype=float))
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=np.concatenate([x, x[::-1]]),
            y=np.concatenate([mean + std, (mean - std)[::-1]]),
            fill="toself",
            mode="lines",
            fillcolor=ACCENT_BAND,
            line={"width": 0},
            hoverinfo="skip",
            name="± std over hospitals",
        )
    )
    fig.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", name="averaged", line={"color": ACCENT, "width": 3}))
    fig.add_trace(go.Scatter(x=x, y=std, mode="lines", name="std", line={"color": MUTED, "width": 1.5, "dash": "dot"}))
    fig.update_yaxes(range=[0, 1.02])
    fig.update_xaxes(dtick=1 if len(x) <= 20 else None)
    return _layout(fig, title, y_title)


def transmitted(rounds: pd.DataFrame) -> go.Figure:
    """Values sent (server -> clients) and received (clients -> server) per round, and their running total."""
    fig = go.Figure()
    fig.add_trace(go.Bar(x=rounds["round"], y=rounds["values_sent"], name="sent", marker_color=PALETTE[0]))
    fig.add_trace(go.Bar(x=rounds["round"], y=rounds["values_received"], name="received", marker_color=PALETTE[1]))
    fig.add_trace(
        go.Scatter(
            x=rounds["round"],
            y=rounds["values_total"],
            name="total so far",
            mode="lines+markers",
            yaxis="y2",
            line={"color": PALETTE[7], "width": 2},
        )
    )
    fig.update_layout(
        barmode="stack",
        yaxis2={"overlaying": "y", "side": "right", "showgrid": False, "title": "total so far", "rangemode": "tozero"},
    )
    fig.update_xaxes(dtick=1 if len(rounds) <= 20 else None)
    return _layout(fig, "Values transmitted", "values per round")


def xi_heatmap(matrix: np.ndarray, round_number: int) -> go.Figure:
    """The AMP matrix xi: row i = how much hospital i's aggregated model takes from each hospital j."""
    labels = [hospital_label(i) for i in range(matrix.shape[0])]
    fig = go.Figure(
        go.Heatmap(
            z=matrix,
            x=labels,
            y=labels,
            colorscale="Teal",
            zmin=0,
            zmax=1,
            text=np.round(matrix, 3),
            texttemplate="%{text}",
            hovertemplate="%{y} takes %{z:.3f} from %{x}<extra></extra>",
            colorbar={"title": "ξ"},
        )
    )
    fig.update_yaxes(autorange="reversed", title="learns (row)")
    fig.update_xaxes(title="from (column)", side="bottom")
    return _layout(fig, f"Who learns from whom: AMP matrix ξ, round {round_number}", "learns (row)", x_title="from")


def roc_curve(
    curve: Roc,
    name: str,
    colour: str = ACCENT,
    marker: tuple[float, float] | None = None,
    explored: tuple[float, float] | None = None,
    marker_name: str = "threshold in use",
    explored_name: str = "exploring",
) -> go.Figure:
    """The ROC curve in ``colour`` with its AUC in the legend and the chance diagonal; ``marker`` (false positive
    rate, sensitivity) marks where the threshold in use (the model card's) sits on the curve, ``explored`` where
    a threshold being explored (not saved) would sit."""
    auc = "undefined (one class)" if curve.auc is None else f"{curve.auc:.3f}"
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="chance", line={"color": MUTED, "dash": "dash"}))
    fig.add_trace(
        go.Scatter(
            x=curve.fpr,
            y=curve.tpr,
            mode="lines",
            name=f"{name} (AUC {auc})",
            line={"color": colour, "width": 3},
        )
    )
    shown = ((marker, marker_name, "diamond", PALETTE[7]), (explored, explored_name, "circle-open", MUTED))
    for point, label, symbol, tint in shown:
        if point is not None and all(np.isfinite(point)):
            fig.add_trace(
                go.Scatter(
                    x=[point[0]],
                    y=[point[1]],
                    mode="markers",
                    name=label,
                    marker={"color": tint, "size": 11, "symbol": symbol, "line": {"width": 2, "color": tint}},
                )
            )
    fig.update_xaxes(range=[0, 1], title="false positive rate (1 - specificity)")
    fig.update_yaxes(range=[0, 1.02], title="true positive rate (sensitivity)", scaleanchor="x", scaleratio=1)
    return _layout(fig, f"ROC curve, AUC {auc}", "true positive rate", height=380, x_title="false positive rate")


def confusion(matrix: np.ndarray, threshold: float, whose: str = "") -> go.Figure:
    """2x2 confusion matrix (rows true class, columns predicted) with counts written in the cells; ``whose``
    names the threshold in the title (for example "the model card's")."""
    names = ["normal", "abnormal"]
    cells = [["true negative", "false positive"], ["false negative", "true positive"]]
    text = [[f"{cells[r][c]}<br><b>{int(matrix[r][c])}</b>" for c in range(2)] for r in range(2)]
    fig = go.Figure(
        go.Heatmap(
            z=matrix,
            x=[f"predicted {n}" for n in names],
            y=[f"true {n}" for n in names],
            colorscale="Blues",
            zmin=0,
            showscale=False,
            text=text,
            texttemplate="%{text}",
            textfont={"size": 16},
            hovertemplate="%{y}, %{x}: %{z}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    named = f" ({whose})" if whose else ""
    return _layout(fig, f"Confusion matrix at threshold {threshold:.2f}{named}", "", height=380, x_title="")


def overlay(curves: Mapping[str, pd.Series], title: str, y_title: str) -> go.Figure:
    """One line per run (series indexed by round), for the Compare page."""
    fig = go.Figure()
    for i, (name, series) in enumerate(curves.items()):
        fig.add_trace(
            go.Scatter(
                x=series.index,
                y=series.to_numpy(dtype=float),
                mode="lines+markers",
                name=name,
                line={"color": PALETTE[i % len(PALETTE)], "width": 2},
            )
        )
    fig.update_yaxes(range=[0, 1.02])
    longest = max((len(s) for s in curves.values()), default=0)
    fig.update_xaxes(dtick=1 if longest <= 20 else None)
    return _layout(fig, title, y_title, height=380)


def _luminance(rgb: Sequence[float]) -> float:
    """WCAG 2 relative luminance of an sRGB colour given as 0-255 channels."""
    linear = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(first: Sequence[float], second: Sequence[float]) -> float:
    """WCAG 2 contrast ratio of two sRGB colours (0-255 channels), from 1 to 21."""
    high, low = sorted((_luminance(first), _luminance(second)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _rgb(colour: str) -> tuple[float, float, float]:
    """``rgb(r, g, b)`` or ``#rrggbb`` as 0-255 channels."""
    if colour.startswith("#"):
        return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)
    r, g, b = (float(v) for v in re.findall(r"[\d.]+", colour)[:3])
    return r, g, b


def text_colour(background: str) -> str:
    """Black or white, whichever contrasts more with ``background``: at least 4.58:1 (WCAG AA asks 4.5:1) for
    any background colour."""
    cell = _rgb(background)
    return "#000000" if contrast_ratio(cell, (0, 0, 0)) >= contrast_ratio(cell, (255, 255, 255)) else "#ffffff"


def grid_heatmap(table: pd.DataFrame, title: str, labels: Sequence[str] = ()) -> go.Figure:
    """nhead (rows) x distance metric (columns) heatmap of one figure over an ablation grid.

    Each cell is labelled with its value in black or white, whichever contrasts more with the cell's own viridis
    colour (`text_colour`: at least 4.5:1); a cell without a value (no finished run) reads "no run"."""
    from plotly.colors import sample_colorscale

    z = table.to_numpy(dtype=float)
    x = list(labels) or [str(c) for c in table.columns]
    y = [str(i) for i in table.index]
    finite = z[np.isfinite(z)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if high <= low:
        low, high = low - 0.5, high + 0.5
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=y,
            zmin=low,
            zmax=high,
            colorscale="Viridis",
            hovertemplate="nhead %{y}, %{x}: %{z:.3f}<extra></extra>",
            hoverongaps=False,
        )
    )
    # The labels are annotations rather than the trace's text, so each takes the colour that reads on its cell.
    for i in range(len(y)):
        for j in range(len(x)):
            value = z[i, j]
            if np.isfinite(value):
                cell = sample_colorscale("Viridis", [(value - low) / (high - low)])[0]
                text, colour = f"{value:.3f}", text_colour(cell)
            else:
                text, colour = "no run", "#000000"  # the page's white shows through an empty cell
            # by category position (j, i): a name that looks like a number ("6") would be read as a position
            fig.add_annotation(x=j, y=i, text=text, showarrow=False, font={"color": colour, "size": 13})
    fig.update_yaxes(title="nhead", type="category")
    fig.update_xaxes(title="distance metric dm", type="category")
    return _layout(fig, title, "nhead", height=360, x_title="distance metric dm")


def _number(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, int | float | np.integer | np.floating) else str(value)


def describe(fig: go.Figure) -> str:
    """A text alternative for a figure, read from the figure itself (title, axes, each series' first and last
    point, or a heatmap's range), so that a screen reader hears what the eye sees. Series without points and
    unnamed reference lines (the chance diagonal) are left out."""
    layout = fig.layout
    title = layout.title.text or "Chart"
    x_title = layout.xaxis.title.text or "x"
    y_title = layout.yaxis.title.text or "y"
    parts: list[str] = []
    for trace in fig.data:
        name = getattr(trace, "name", None)
        if trace.type == "heatmap":
            values = np.asarray(trace.z, dtype=float)
            finite = values[np.isfinite(values)]
            if finite.size:
                parts.append(f"a {values.shape[0]} by {values.shape[1]} grid of values from "
                             f"{_number(finite.min())} to {_number(finite.max())}")  # fmt: skip
            continue
        xs = [] if getattr(trace, "x", None) is None else list(trace.x)
        ys = [] if getattr(trace, "y", None) is None else list(trace.y)
        if not name or not xs or not ys:
            continue
        if len(xs) == 1:
            parts.append(f"{name}: {_number(ys[0])} at {x_title} {_number(xs[0])}")
        else:
            parts.append(
                f"{name}: {_number(ys[0])} at {x_title} {_number(xs[0])} to {_number(ys[-1])} at {x_title} "
                f"{_number(xs[-1])}"
            )
    shown = "; ".join(parts) if parts else "no data yet"
    return f"{title} ({y_title} against {x_title}): {shown}."
