"""The prepare report: tiles per client x split x label, hospital flags, skipped slides, and a contact sheet.

This is what a data engineer reads after `gastric-fl prepare` (issue: "A report printed and saved"); the
dataset it describes follows FedSAF paper 001, Sec. 4.2 (Figure 3 shows two hospitals differing in size,
image size and colour, which is what the table's columns make visible).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from pipeline.config import LABELS
from pipeline.tiling import HospitalPlan

SPLITS: tuple[str, ...] = ("train", "val", "test")
# every hospital needs tiles of these; validation may be empty (a hospital with too few slides, --val-fraction 0)
REQUIRED_SPLITS: tuple[str, ...] = ("train", "test")
Counts = dict[int, dict[str, dict[str, int]]]

_THUMB = 96
_PER_LABEL = 4
_GAP = 4
_LEFT = 150
_HEADER = 26
_BG = 255
# Border colours (BGR) of classes other than normal/abnormal, in class order.
_CYCLE: tuple[tuple[int, int, int], ...] = (
    (180, 119, 31),
    (14, 127, 255),
    (44, 160, 44),
    (40, 39, 214),
    (189, 103, 148),
    (75, 86, 140),
    (194, 119, 227),
    (127, 127, 127),
    (34, 189, 188),
    (207, 190, 23),
)


@dataclass(frozen=True)
class Skipped:
    """A slide left out, and why (one line naming the file)."""

    source: str
    reason: str


def empty_counts(hospitals: int, classes: Sequence[str] = LABELS) -> Counts:
    """``counts[client][split][label] = 0`` for every combination (labels in class order)."""
    return {c: {s: dict.fromkeys(classes, 0) for s in SPLITS} for c in range(hospitals)}


def _classes_of(counts: Counts) -> list[str]:
    """The labels of a counts table, in its (class) order."""
    first = next(iter(counts.values()), None)
    return list(first[SPLITS[0]]) if first is not None else list(LABELS)


def _table_rows(
    plans: Sequence[HospitalPlan], counts: Counts, slides: Mapping[int, int]
) -> tuple[list[str], list[list[str]]]:
    labels = _classes_of(counts)
    # The site column appears only when some hospital has a simulated stain profile, so other reports read as before.
    profiled = any(plan.stain_profile is not None for plan in plans)
    header = ["client", "gray", *(["site"] if profiled else []), "tile px", "scale", "src px", "slides"]
    header += [f"{s} {lab}" for s in SPLITS for lab in labels] + ["tiles"]
    rows = []
    for plan in plans:
        per = counts[plan.hospital]
        cells = [per[s][lab] for s in SPLITS for lab in labels]
        rows.append(
            [
                str(plan.hospital),
                "yes" if plan.grayscale else "no",
                *(["shifted" if plan.stain_profile is not None else "-"] if profiled else []),
                str(plan.tile_px),
                f"{plan.scale:g}",
                str(plan.size),
                str(slides.get(plan.hospital, 0)),
                *map(str, cells),
                str(sum(cells)),
            ]
        )
    totals = [sum(counts[p.hospital][s][lab] for p in plans) for s in SPLITS for lab in labels]
    blanks = [""] * (len(header) - 2 - len(totals) - 1)
    rows.append(["all", *blanks, str(sum(slides.values())), *map(str, totals), str(sum(totals))])
    return header, rows


def text_table(plans: Sequence[HospitalPlan], counts: Counts, slides: Mapping[int, int]) -> str:
    """A fixed-width table for the terminal."""
    header, rows = _table_rows(plans, counts, slides)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(plans: Sequence[HospitalPlan], counts: Counts, slides: Mapping[int, int]) -> str:
    """The same table in Markdown."""
    header, rows = _table_rows(plans, counts, slides)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def issues_text(skipped: Sequence[Skipped], warnings: Sequence[str]) -> str:
    """Skipped slides and warnings, one line each (empty string when there are none)."""
    lines = []
    if skipped:
        lines.append(f"Skipped {len(skipped)} slide(s):")
        lines += [f"  - {s.reason}" for s in skipped]
    if warnings:
        lines.append(f"Warnings ({len(warnings)}):")
        lines += [f"  - {w}" for w in warnings]
    return "\n".join(lines)


def markdown_report(
    settings: Mapping[str, str],
    plans: Sequence[HospitalPlan],
    counts: Counts,
    slides: Mapping[int, int],
    skipped: Sequence[Skipped],
    warnings: Sequence[str],
    probe_section: Sequence[str] = (),
) -> str:
    """``report.md``: settings, the table, skipped slides, warnings, the shortcut probe, the contact sheet."""
    parts = ["# Prepared dataset", "", "| setting | value |", "|---|---|"]
    parts += [f"| {k} | {v} |" for k, v in settings.items()]
    parts += ["", "## Tiles per client, split and label", "", markdown_table(plans, counts, slides), ""]
    parts += [
        "`gray`: tiles stored single-channel. `site`: tiles passed through a simulated stain and scanner profile "
        "(values in prepare.json, `clients[].site`). `tile px`: tile side in the PNG. `scale`: resampling of the "
        "slide (1 = original resolution). `src px`: tile side in original slide pixels (manifest `size`).",
        "",
        f"## Skipped slides ({len(skipped)})",
        "",
    ]
    parts += [f"- `{s.source}`: {s.reason}" for s in skipped] or ["None."]
    parts += ["", f"## Warnings ({len(warnings)})", ""]
    parts += [f"- {w}" for w in warnings] or ["None."]
    parts += ["", *probe_section]
    parts += ["", "## Sample tiles", "", "![contact sheet](contact_sheet.png)", ""]
    return "\n".join(parts)


def _thumbnail(path: Path) -> npt.NDArray[np.uint8]:
    tile = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if tile is None:  # an unreadable tile would be a bug upstream; show a gray square rather than crash the report
        return np.full((_THUMB, _THUMB, 3), 128, dtype=np.uint8)
    return np.asarray(cv2.resize(tile, (_THUMB, _THUMB), interpolation=cv2.INTER_AREA), dtype=np.uint8)


def contact_sheet(
    root: Path,
    plans: Sequence[HospitalPlan],
    samples: Mapping[int, Mapping[str, Sequence[str]]],
    classes: Sequence[str] = LABELS,
) -> npt.NDArray[np.uint8]:
    """One row per client: sample tiles of each class in class order (BGR image, borders coloured by class).

    Binary datasets show 4 normal then 4 abnormal tiles (green and red borders); with K classes each class gets
    ``max(1, 8 // K)`` tiles. A hospital with a simulated stain profile has it written under its name.
    """
    labels = list(classes)
    per_label = _PER_LABEL if len(labels) <= 2 else max(1, 2 * _PER_LABEL // len(labels))
    width = _LEFT + len(labels) * per_label * (_THUMB + _GAP) + _GAP
    row_h = _THUMB + 2 * _GAP
    sheet = np.full((_HEADER + row_h * len(plans) + _GAP, width, 3), _BG, dtype=np.uint8)
    colours = {"normal": (60, 160, 60), "abnormal": (40, 40, 200)}
    for k, label in enumerate(labels):
        colours.setdefault(label, _CYCLE[k % len(_CYCLE)])
        left = _LEFT + k * per_label * (_THUMB + _GAP)
        cv2.putText(sheet, label[:14], (left, 18), cv2.FONT_HERSHEY_SIMPLEX, 0.55, colours[label], 1, cv2.LINE_AA)
    for r, plan in enumerate(plans):
        top = _HEADER + r * row_h + _GAP
        text = f"client {plan.hospital}"
        detail = f"{plan.tile_px}px{' gray' if plan.grayscale else ''} x{plan.scale:g}"
        cv2.putText(sheet, text, (6, top + 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1, cv2.LINE_AA)
        cv2.putText(sheet, detail, (6, top + 44), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (60, 60, 60), 1, cv2.LINE_AA)
        if plan.stain_profile is not None:
            for j, line in enumerate(plan.stain_profile.describe()):
                cv2.putText(
                    sheet, line, (6, top + 66 + 16 * j), cv2.FONT_HERSHEY_SIMPLEX, 0.36, (120, 60, 0), 1, cv2.LINE_AA
                )
        for k, label in enumerate(labels):
            for i, rel in enumerate(list(samples.get(plan.hospital, {}).get(label, []))[:per_label]):
                left = _LEFT + (k * per_label + i) * (_THUMB + _GAP)
                sheet[top : top + _THUMB, left : left + _THUMB] = _thumbnail(root / rel)
                cv2.rectangle(sheet, (left, top), (left + _THUMB - 1, top + _THUMB - 1), colours[label], 2)
    return sheet
