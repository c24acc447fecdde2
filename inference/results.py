"""What ``gastric-fl predict`` writes in words and tables: ``tiles.csv`` per slide, ``summary.csv`` over the slides,
and the line on the slide calls against the slides' truth (`inference.predict`).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.scoring import SlideTiles
from inference.slides import SlideFile
from models.decision import FALSE_ALARM, MISSED_CANCER

TILE_COLUMNS = ("x", "y", "size", "probability", "truth", "tissue", "distance")
SUMMARY_COLUMNS = (
    "slide",
    "folder",
    "file",
    "tiles",
    "max_probability",
    "top_k_mean",
    "call",
    "truth",
    "threshold",
    "abnormal_area_fraction",
    "sensitivity",
    "specificity",
    "unfamiliar_share",
    "unfamiliar",
    "focus",
    "review",
    "reported",
    "outcome",
)


@dataclass
class SlideResult:
    """What predict wrote for one slide (``summary`` is ``summary.json``), or why it was skipped; ``warnings``: what
    the user should know about a scored slide (a black slide, an SVG clipped to the slide)."""

    file: SlideFile
    summary: dict[str, Any] = field(default_factory=dict)
    folder: Path | None = None
    problem: str | None = None
    warnings: tuple[str, ...] = ()


def _tiles_csv(tiles: SlideTiles) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TILE_COLUMNS)
    labels = {1: "abnormal", 0: "normal", -1: ""}
    for k in range(len(tiles.probability)):
        truth = "" if tiles.truth is None else labels[int(tiles.truth[k])]
        familiar = "" if tiles.unfamiliar is None else "unfamiliar" if tiles.unfamiliar[k] else "familiar"
        distance = "" if tiles.distance is None else f"{tiles.distance[k]:.6g}"
        writer.writerow(
            [int(tiles.xs[k]), int(tiles.ys[k]), tiles.size, f"{tiles.probability[k]:.17g}", truth, familiar, distance]
        )
    return buffer.getvalue().encode("utf-8")


def _flag(value: object, known: bool) -> str:
    """``true``/``false`` for summary.csv, empty where the value is not known (no description, a skipped slide)."""
    return ("true" if value else "false") if known else ""


def _summary_csv(results: Sequence[SlideResult]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*SUMMARY_COLUMNS, "problem"])
    for r in results:
        s = r.summary
        truth = s.get("ground_truth", {})

        def fmt(value: Any) -> str:
            return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.6g}"

        writer.writerow(
            [
                r.file.name,
                r.file.output_name if r.folder is not None else "",
                str(r.file.path),
                s.get("tiles", ""),
                fmt(s.get("max_probability")),
                fmt(s.get("top_k_mean")),
                s.get("call", ""),
                s.get("truth") or "",
                fmt(s.get("threshold")),
                fmt(s.get("abnormal_area_fraction")),
                fmt(truth.get("sensitivity")),
                fmt(truth.get("specificity")),
                fmt(s.get("unfamiliar_share")),
                _flag(s.get("unfamiliar"), s.get("unfamiliar_share") is not None),
                _flag(s.get("focus"), bool(s)),
                _flag(s.get("review"), bool(s)),
                s.get("reported", ""),
                s.get("outcome", ""),
                r.problem or "",
            ]
        )
    return buffer.getvalue().encode("utf-8")


def slide_calls_line(results: Sequence[SlideResult]) -> str | None:
    """One line on the slide calls against the slides' truth (those with an annotation or a ``normal`` folder):
    abnormal slides called abnormal and normal slides called normal, with the threshold; ``None`` without truth."""
    judged = [r.summary for r in results if r.problem is None and r.summary.get("truth") in ("abnormal", "normal")]
    if not judged:
        return None
    abnormal = [s for s in judged if s["truth"] == "abnormal"]
    normal = [s for s in judged if s["truth"] == "normal"]
    found = sum(s["call"] == "abnormal" for s in abnormal)
    cleared = sum(s["call"] == "normal" for s in normal)
    thresholds = sorted({f"{float(s['threshold']):.2f}" for s in judged})
    text = (
        f"slide calls at threshold {', '.join(thresholds)}: {found} of {len(abnormal)} abnormal slides called "
        f"abnormal, {cleared} of {len(normal)} normal slides called normal"
    )
    for word in (MISSED_CANCER, FALSE_ALARM):
        named = [str(s["slide"]) for s in judged if s.get("outcome") == word]
        text += f"; {word}: {', '.join(named)}" if named else ""
    unfamiliar = sum(bool(s.get("unfamiliar")) for s in judged)
    focus = sum(bool(s.get("focus")) for s in judged)
    text += f"; {unfamiliar} UNFAMILIAR (do not rely on their calls)" if unfamiliar else ""
    return text + (f"; {focus} normal with a focus above the threshold (review)" if focus else "")
