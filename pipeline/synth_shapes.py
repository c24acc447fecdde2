"""Carcinoma regions of a synthetic slide: vector shapes, their SVG annotation and their pixel mask.

The FedSAF paper (001, Sec. 4.1 and Table 2) describes BOT as TIFF slides whose cancerous regions are drawn in SVG
annotations and SEED as PNG slides with a grayscale mask; Sec. 4.2 derives each slide's label from that mask. A
synthetic abnormal slide therefore needs one geometry that serves three purposes at once: the area painted as
carcinoma, the SEED mask, and the BOT SVG. Every region here is a star-shaped closed curve (so it never crosses
itself and filled area is the same under the nonzero and even-odd rules), written the way drawing tools write
annotations: cubic or quadratic ``<path>`` curves (some with relative commands), ``<polygon>`` outlines, groups
with ``translate``/``rotate``/``scale`` transforms, filled or outline-only.

Coordinates are rounded to the two decimals written in the SVG *before* the mask is rasterised, so the mask is the
area the file itself encloses, not an approximation of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal
from xml.sax.saxutils import escape

import cv2
import numpy as np
from numpy.typing import NDArray

Kind = Literal["cubic", "quad", "polygon"]
FloatArray = NDArray[np.float64]

# Points sampled per curve segment when rasterising: more than enough for sub-pixel agreement at 2048 px.
_SAMPLES_PER_SEGMENT = 24
# Sub-pixel precision (bits) for cv2.fillPoly.
_SHIFT = 4


@dataclass(frozen=True)
class Region:
    """One annotated carcinoma region.

    ``nodes`` are the coordinates exactly as written in the SVG (two decimals): for ``cubic`` the start point
    followed by three points per ``C`` segment, for ``quad`` the start point followed by two per ``Q`` segment,
    for ``polygon`` the vertices. ``matrix`` is the affine transform of the enclosing ``<g>`` (identity when the
    shape is not grouped), ``transform`` its SVG text.
    """

    kind: Kind
    nodes: FloatArray
    matrix: FloatArray
    transform: str | None
    outline_only: bool
    relative: bool

    def outline(self) -> FloatArray:
        """Dense closed outline in image pixels (N x 2), the group transform applied."""
        if self.kind == "polygon":
            local = self.nodes
        elif self.kind == "cubic":
            local = _sample_bezier(self.nodes, degree=3)
        else:
            local = _sample_bezier(self.nodes, degree=2)
        homog = np.concatenate([local, np.ones((len(local), 1))], axis=1)
        out: FloatArray = homog @ self.matrix.T
        return out


def _sample_bezier(nodes: FloatArray, degree: int) -> FloatArray:
    """Sample a chain of Bézier segments sharing end points (start, then ``degree`` points per segment)."""
    t = np.linspace(0.0, 1.0, _SAMPLES_PER_SEGMENT, endpoint=False)[:, None]
    pieces = []
    for k in range(0, len(nodes) - 1, degree):
        p = nodes[k : k + degree + 1]
        if degree == 3:
            seg = (1 - t) ** 3 * p[0] + 3 * (1 - t) ** 2 * t * p[1] + 3 * (1 - t) * t**2 * p[2] + t**3 * p[3]
        else:
            seg = (1 - t) ** 2 * p[0] + 2 * (1 - t) * t * p[1] + t**2 * p[2]
        pieces.append(seg)
    return np.concatenate(pieces, axis=0)


def _affine(tx: float, ty: float, angle_deg: float, sx: float, sy: float) -> FloatArray:
    """Matrix of SVG ``translate(tx ty) rotate(angle) scale(sx sy)`` (applied right to left, as SVG does)."""
    a = math.radians(angle_deg)
    c, s = math.cos(a), math.sin(a)
    return np.array([[c * sx, -s * sy, tx], [s * sx, c * sy, ty]], dtype=np.float64)


def _star_points(rng: np.random.Generator, n: int, radius: float, wobble: float) -> FloatArray:
    """``n`` points around the origin at increasing angles with smoothly varying radii (a star-shaped blob)."""
    step = 2 * math.pi / n
    angles = np.arange(n) * step + rng.uniform(-0.25, 0.25, n) * step + rng.uniform(0, 2 * math.pi)
    raw = rng.normal(0.0, 1.0, n)
    # Circular smoothing keeps neighbouring radii alike, so curves stay convex-ish and never self-intersect.
    smooth = (np.roll(raw, 1) + 2 * raw + np.roll(raw, -1)) / 4
    radii = radius * np.clip(1.0 + wobble * smooth, 0.55, 1.45)
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _catmull_rom_nodes(pts: FloatArray) -> FloatArray:
    """Closed Catmull-Rom spline through ``pts`` as cubic Bézier nodes (start + 3 per segment)."""
    n = len(pts)
    nodes = [pts[0]]
    for i in range(n):
        p0, p1, p2, p3 = pts[i - 1], pts[i], pts[(i + 1) % n], pts[(i + 2) % n]
        nodes += [p1 + (p2 - p0) / 6.0, p2 - (p3 - p1) / 6.0, p2]
    return np.array(nodes)


def _quad_nodes(pts: FloatArray) -> FloatArray:
    """Closed quadratic B-spline with control points ``pts``: on-curve points are the edge midpoints."""
    n = len(pts)
    mids = (pts + np.roll(pts, -1, axis=0)) / 2
    nodes = [mids[n - 1]]
    for i in range(n):
        nodes += [pts[i], mids[i]]
    return np.array(nodes)


def make_regions(
    rng: np.random.Generator, size: int, area_fraction: float, count: int, force_group: bool = True
) -> list[Region]:
    """Random carcinoma regions covering roughly ``area_fraction`` of a ``size`` x ``size`` slide in total.

    With ``force_group`` the first region sits in a transformed ``<g>``, so every annotation file exercises
    transforms; the others pick a representation at random.
    """
    shares = rng.dirichlet(np.full(count, 2.0)) * area_fraction * size * size
    kinds: tuple[Kind, ...] = ("cubic", "quad", "polygon")
    regions = []
    for i, share in enumerate(shares):
        kind = kinds[int(rng.integers(3))]
        grouped = (i == 0 and force_group) or bool(rng.random() < 0.4)
        sx, sy = (float(v) for v in rng.uniform(0.75, 1.3, 2)) if grouped else (1.0, 1.0)
        radius = math.sqrt(share / math.pi / (sx * sy))
        n = int(rng.integers(7, 11)) if kind != "polygon" else int(rng.integers(14, 25))
        local = _star_points(rng, n, radius, wobble=0.32)
        # Keep the whole (transformed) shape inside the slide with a small margin; 1.15 covers spline overshoot.
        margin = 0.02 * size
        reach = float(np.linalg.norm(local, axis=1).max()) * 1.15 * max(sx, sy)
        room = size / 2 - margin - 1
        if reach > room:
            local = local * (room / reach)
            reach = room
        cx, cy = (float(v) for v in rng.uniform(margin + reach, size - margin - reach, 2))
        angle = float(rng.uniform(-180, 180)) if grouped else 0.0
        if kind == "cubic":
            nodes = _catmull_rom_nodes(local)
        elif kind == "quad":
            nodes = _quad_nodes(local)
        else:
            nodes = local
        if grouped:
            tx, ty, angle, sx, sy = (round(v, 2) for v in (cx, cy, angle, sx, sy))
            matrix = _affine(tx, ty, angle, sx, sy)
            transform = f"translate({tx:.2f} {ty:.2f}) rotate({angle:.2f}) scale({sx:.2f} {sy:.2f})"
            nodes = np.round(nodes, 2)
        else:
            matrix = _affine(0.0, 0.0, 0.0, 1.0, 1.0)
            transform = None
            nodes = np.round(nodes + np.array([cx, cy]), 2)
        regions.append(
            Region(
                kind=kind,
                nodes=nodes,
                matrix=matrix,
                transform=transform,
                outline_only=bool(rng.random() < 0.5),
                relative=kind == "quad" and bool(rng.random() < 0.5),
            )
        )
    return regions


def rasterize(regions: list[Region], size: int) -> NDArray[np.uint8]:
    """Union of the regions' enclosed areas as a ``size`` x ``size`` mask of 0/1."""
    mask = np.zeros((size, size), np.uint8)
    for region in regions:
        pts = np.round(region.outline() * (1 << _SHIFT)).astype(np.int32)
        # One polygon per call: cv2.fillPoly uses even-odd filling across the polygons of a single call.
        cv2.fillPoly(mask, [pts], 1, lineType=cv2.LINE_8, shift=_SHIFT)
    return mask


def _fmt(p: FloatArray) -> str:
    return f"{p[0]:.2f},{p[1]:.2f}"


def _path_d(region: Region) -> str:
    nodes = region.nodes
    step = 3 if region.kind == "cubic" else 2
    letter = "C" if region.kind == "cubic" else "Q"
    if not region.relative:
        parts = [f"M {_fmt(nodes[0])}"]
        for k in range(1, len(nodes), step):
            parts.append(f"{letter} " + " ".join(_fmt(p) for p in nodes[k : k + step]))
        return " ".join(parts) + " Z"
    # Relative commands, as Inkscape writes them: offsets from the current point (the previous segment's end).
    parts = [f"m {_fmt(nodes[0])}"]
    current = nodes[0]
    for k in range(1, len(nodes), step):
        seg = nodes[k : k + step]
        parts.append(f"{letter.lower()} " + " ".join(_fmt(np.round(p - current, 2)) for p in seg))
        current = seg[-1]
    return " ".join(parts) + " z"


def svg_document(regions: list[Region], size: int, title: str) -> str:
    """The annotation file for one abnormal slide: width, height and viewBox equal the slide size in pixels."""
    lines = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{size}" height="{size}" '
        f'viewBox="0 0 {size} {size}">',
        f"  <title>{escape(title)}</title>",
        '  <g id="carcinoma" stroke-linejoin="round">',
    ]
    for i, region in enumerate(regions):
        if region.outline_only:
            style = 'fill="none" stroke="#00a000" stroke-width="4"'
        else:
            style = 'style="fill:#ff0000;fill-opacity:0.3;stroke:#c00000;stroke-width:2"'
        if region.kind == "polygon":
            points = " ".join(_fmt(p) for p in region.nodes)
            shape = f'<polygon id="region{i}" points="{points}" {style}/>'
        else:
            shape = f'<path id="region{i}" d="{_path_d(region)}" {style}/>'
        if region.transform is None:
            lines.append(f"    {shape}")
        else:
            lines.append(f'    <g id="group{i}" transform="{region.transform}">')
            lines.append(f"      {shape}")
            lines.append("    </g>")
    lines += ["  </g>", "</svg>", ""]
    return "\n".join(lines)
