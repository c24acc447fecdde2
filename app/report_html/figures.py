"""The HTML report's pictures, each as PNG bytes to be inlined as a base64 ``data:`` URI (`_data_uri`).

The ROC curve with its operating point, the confusion matrix at the threshold, a multi-class run's round curves
(`rounds_png`), the heatmaps' colour bar (drawn by
matplotlib on an Agg canvas with no pyplot state and no metadata, `_figure_png`), heatmap overlays downscaled for
the page and test tiles read from the prepared dataset (confined to it, re-encoded as PNG where they are not).
Colours are colour-blind safe: Okabe-Ito for lines and markers, cividis for the matrix, viridis for heatmaps
(docs/dashboard.md, "The hospital's report: `gastric-fl report --html`"). Nothing here reads a run or writes a
file, and nothing imports torch; the package's other parts depend on this one, never the reverse (docs/design.md,
"Layout and layers").
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from infra.outputs import PathOutsideError, confine

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision deficiency.
OKABE_ITO = {"blue": "#0072B2", "vermillion": "#D55E00", "grey": "#999999", "green": "#009E73", "orange": "#E69F00"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _figure_png(draw: Callable[[Any], None], size: tuple[float, float] = (4.2, 4.0)) -> bytes:
    """A matplotlib figure drawn by ``draw(axes)`` as PNG bytes (Agg, no pyplot state, no metadata)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    draw(axes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def roc_png(
    fpr: npt.NDArray[np.float64], tpr: npt.NDArray[np.float64], point: tuple[float, float], auc: float
) -> bytes:
    """The ROC curve, the chance diagonal and the operating point at the threshold."""

    def draw(ax: Any) -> None:
        ax.plot([0, 1], [0, 1], linestyle="--", color=OKABE_ITO["grey"], linewidth=1, label="chance")
        ax.plot(fpr, tpr, color=OKABE_ITO["blue"], linewidth=2, label=f"ROC (AUC {auc:.3f})")
        ax.plot([point[0]], [point[1]], "o", color=OKABE_ITO["vermillion"], markersize=8, label="threshold")
        ax.set_xlabel("1 - specificity (normal tiles flagged)")
        ax.set_ylabel("sensitivity (abnormal tiles found)")
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.set_aspect("equal")
        ax.legend(loc="lower right", fontsize=8)

    return _figure_png(draw)


def rounds_png(rounds: list[int], accuracy: list[float | None], auc: list[float | None]) -> bytes:
    """A hospital's test accuracy and macro one-vs-rest AUC over the rounds (a multi-class run's round curves);
    an undefined value is a gap."""

    def draw(ax: Any) -> None:
        for values, name, colour, marker in (
            (accuracy, "accuracy", OKABE_ITO["blue"], "o"),
            (auc, "macro one-vs-rest AUC", OKABE_ITO["vermillion"], "s"),
        ):
            shown = [float("nan") if v is None else v for v in values]
            ax.plot(rounds, shown, color=colour, marker=marker, linewidth=2, label=name)
        ax.set_xlabel("round")
        ax.set_ylabel("on the hospital's test tiles")
        ax.set_xticks(rounds)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)

    return _figure_png(draw, (5.0, 3.4))


def confusion_png(matrix: npt.NDArray[np.int64], threshold: float) -> bytes:
    """The 2x2 confusion matrix (rows: truth, columns: call) in cividis, with the counts written in."""

    def draw(ax: Any) -> None:
        ax.imshow(matrix, cmap="cividis", vmin=0, vmax=max(1, int(matrix.max())))
        for i in range(2):
            for j in range(2):
                dark = matrix[i, j] < 0.5 * max(1, int(matrix.max()))
                ax.text(j, i, str(int(matrix[i, j])), ha="center", va="center", fontsize=16,
                        color="white" if dark else "black")  # fmt: skip
        ax.set_xticks([0, 1], ["called normal", "called abnormal"])
        ax.set_yticks([0, 1], ["truly normal", "truly abnormal"])
        ax.set_title(f"at threshold {threshold:.2f}", fontsize=10)

    return _figure_png(draw, (4.2, 3.6))


def bar_strip(threshold: float) -> npt.NDArray[np.uint8]:
    """The bar's colours from ``threshold`` to 1, one per lookup-table level (`app.colour_scale.bar_levels`): the
    overlay's own viridis of P (`app.colour_scale.viridis_rgb`), not rescaled to the threshold, so a tile at P 0.6
    reads 0.6 on the bar."""
    from app.colour_scale import bar_levels, viridis_rgb

    return viridis_rgb(bar_levels(threshold))


def colour_bar_png(threshold: float) -> bytes:
    """The heatmaps' colour bar, titled P(abnormal): viridis from the threshold to 1; below the threshold the slide
    is left uncoloured (shown light grey on the bar); the threshold marked with ▲. What it means is said in the
    heatmap's caption, so that the bar's own words stay short and whole."""

    def draw(ax: Any) -> None:
        t = min(max(threshold, 0.0), 1.0)
        ax.axvspan(0.0, t, color="#e1e1e1")
        ax.imshow(bar_strip(t)[None, :, :], extent=(t, 1.0, 0.0, 1.0), aspect="auto", interpolation="nearest")
        ax.axvline(t, color="black", linewidth=2)
        ax.set_xlim(0.0, 1.0)
        ax.set_yticks([])
        mark = round(t, 2)
        ticks = sorted({mark, *(v for v in (0.0, 0.5, 1.0) if abs(v - mark) >= 0.15)})
        ax.set_xticks(ticks, [f"▲{v:.2f}" if v == mark else f"{v:g}" for v in ticks], fontsize=10)
        ax.set_xlabel("P(abnormal)", fontsize=10)

    return _figure_png(draw, size=(4.6, 1.0))


def _downscaled_png(path: Path, max_side: int) -> tuple[bytes, int, int]:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"{path} is not a readable PNG")
    height, width = image.shape[:2]
    scale = min(1.0, max_side / max(height, width))
    if scale < 1.0:
        image = cv2.resize(image, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)
    ok, data = cv2.imencode(".png", image)
    if not ok:
        raise ValueError(f"{path}: could not encode a PNG")
    return data.tobytes(), image.shape[1], image.shape[0]


def _tile_png(dataset: Path, relative: str) -> bytes | None:
    try:
        path = confine(dataset, relative)
        data = path.read_bytes()
    except (PathOutsideError, OSError):
        return None
    if data.startswith(PNG_MAGIC):
        return data
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if decoded is None:
        return None
    ok, encoded = cv2.imencode(".png", decoded)
    return encoded.tobytes() if ok else None
