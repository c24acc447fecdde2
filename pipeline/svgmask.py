"""Rasterise a BOT SVG annotation into a binary cancer mask (FedSAF paper 001, Sec. 4.1.1 and 4.2).

The BOT dataset marks cancerous regions with SVG shapes. The mask is the region the shapes *enclose*,
whatever their ``fill``/``stroke``: annotation tools often draw outlines only (``fill="none"``).
svgelements parses the file and applies every ``transform`` (``reify``); each shape becomes a path whose
curves are sampled into points, and every subpath with at least three distinct points is filled with
``cv2.fillPoly`` (open subpaths are closed implicitly, as SVG filling does). Filled areas are united, so an
inner subpath does not cut a hole. Shapes reaching outside the slide are clipped to it as polygons
(Sutherland-Hodgman against a box one pixel larger than the slide), which keeps every edge inside the slide
where it was; clamping vertices instead would move edges and lose area. The clipping is reported; an
annotation that encloses no pixel inside the slide is an error (see docs/pipeline.md, "Bad input").
"""

from __future__ import annotations

import io
import itertools
import math
from dataclasses import dataclass
from xml.etree.ElementTree import ParseError

import cv2
import numpy as np
import numpy.typing as npt
import svgelements as se

from pipeline.errors import PipelineError

# cv2.fillPoly works in fixed point with this many fractional bits: sub-pixel vertices keep their position.
_SHIFT = 4
# Curves are sampled about every _CURVE_STEP pixels along their control polygon (an upper bound of length).
_CURVE_STEP = 2.0
# Points this far outside the slide (in pixels) count as "outside"; smaller overshoots are rounding.
_TOLERANCE = 0.5


class AnnotationError(PipelineError):
    """An SVG annotation that cannot be turned into a mask (malformed, empty, wrong canvas size)."""


@dataclass(frozen=True)
class RasterisedAnnotation:
    """The mask (``uint8``, 0 or 255) and a note when shapes reached outside the slide (clipped)."""

    mask: npt.NDArray[np.uint8]
    shapes: int
    clipped: str | None


def _segment_points(segment: se.PathSegment) -> list[tuple[float, float]]:
    """Points along one segment, excluding its start (the previous segment's end)."""
    if isinstance(segment, se.Move | se.Line | se.Close):
        end = segment.end
        return [] if end is None else [(float(end.x), float(end.y))]
    # Curves: the control polygon bounds the arc length, so sampling by it never under-samples.
    if isinstance(segment, se.Arc):
        bbox = segment.bbox()
        bound = 2.0 * ((bbox[2] - bbox[0]) + (bbox[3] - bbox[1]))
    else:
        controls = [
            p
            for p in (
                segment.start,
                getattr(segment, "control", None),
                getattr(segment, "control1", None),
                getattr(segment, "control2", None),
                segment.end,
            )
            if p is not None
        ]
        bound = sum(math.dist((a.x, a.y), (b.x, b.y)) for a, b in itertools.pairwise(controls))
    steps = max(4, min(2048, math.ceil(bound / _CURVE_STEP)))
    pts = segment.npoint(np.linspace(0.0, 1.0, steps + 1)[1:])
    return [(float(x), float(y)) for x, y in np.asarray(pts, dtype=np.float64)]


def _polygons(shape: se.Shape) -> list[npt.NDArray[np.float64]]:
    path = se.Path(shape)
    path.reify()
    polygons: list[npt.NDArray[np.float64]] = []
    for sub in path.as_subpaths():
        points: list[tuple[float, float]] = []
        for segment in sub:
            if isinstance(segment, se.Move):
                start = segment.end
                if start is not None:
                    points = [(float(start.x), float(start.y))]
                continue
            if not points and segment.start is not None:
                points = [(float(segment.start.x), float(segment.start.y))]
            points.extend(_segment_points(segment))
        array = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        if len(np.unique(np.round(array, 3), axis=0)) >= 3 and np.isfinite(array).all():
            polygons.append(array)
    return polygons


def _clip_half_plane(
    points: npt.NDArray[np.float64], axis: int, bound: float, keep_below: bool
) -> npt.NDArray[np.float64]:
    """One Sutherland-Hodgman step: the polygon's part with ``points[:, axis] <= bound`` (or ``>=``)."""
    if len(points) == 0:
        return points
    previous = np.roll(points, 1, axis=0)
    sign = 1.0 if keep_below else -1.0
    now = sign * (points[:, axis] - bound)
    before = sign * (previous[:, axis] - bound)
    inside_now, inside_before = now <= 0.0, before <= 0.0
    crossing = inside_now != inside_before
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(crossing, before / (before - now), 0.0)
    meet = previous + t[:, None] * (points - previous)
    meet[:, axis] = np.where(crossing, bound, meet[:, axis])
    # For each edge previous -> point: the crossing (if any), then the point (if inside); in order.
    candidates = np.stack([meet, points], axis=1)
    keep = np.stack([crossing, inside_now], axis=1)
    return np.asarray(candidates[keep], dtype=np.float64)


def clip_polygon(
    points: npt.NDArray[np.float64], x0: float, y0: float, x1: float, y1: float
) -> npt.NDArray[np.float64]:
    """The polygon ``points`` (N x 2) clipped to the box ``[x0, x1] x [y0, y1]`` (Sutherland-Hodgman).

    Inside the box the region is unchanged; edges along the box border may be degenerate, which filling ignores.
    """
    for axis, bound, keep_below in ((0, x0, False), (0, x1, True), (1, y0, False), (1, y1, True)):
        points = _clip_half_plane(points, axis, bound, keep_below)
    return points


def rasterise_svg(data: bytes, width: int, height: int, name: str) -> RasterisedAnnotation:
    """The area enclosed by the SVG's shapes as a ``height x width`` mask of 0/255.

    Raises `AnnotationError` naming ``name`` when the XML is malformed, the canvas size differs from the
    slide's, there are no closed shapes, or nothing of them lies inside the slide.
    """
    try:
        svg = se.SVG.parse(io.BytesIO(data), reify=True, width=width, height=height)
    except ParseError as exc:
        raise AnnotationError(f"{name}: malformed SVG ({exc}); fix or re-export the annotation") from None
    except Exception as exc:
        raise AnnotationError(f"{name}: SVG could not be parsed ({type(exc).__name__}: {exc})") from None
    canvas = (round(float(svg.width)), round(float(svg.height)))
    if canvas != (width, height):
        raise AnnotationError(
            f"{name}: SVG canvas is {canvas[0]}x{canvas[1]} but the slide is {width}x{height}; the annotation's "
            "width/height must be the slide's size in pixels"
        )
    if svg.viewbox is not None and (round(svg.viewbox.width), round(svg.viewbox.height)) != (width, height):
        raise AnnotationError(
            f"{name}: SVG viewBox is {svg.viewbox.width:g}x{svg.viewbox.height:g} but the slide is {width}x{height}; "
            "the annotation's user units must be the slide's pixels"
        )
    polygons: list[npt.NDArray[np.float64]] = []
    shapes = 0
    for element in svg.elements():
        if isinstance(element, se.Shape) and not isinstance(element, se.SVG):
            found = _polygons(element)
            shapes += bool(found)
            polygons.extend(found)
    if not polygons:
        raise AnnotationError(f"{name}: SVG contains no closed shape (path, polygon, rect, ellipse, circle)")
    everything = np.concatenate(polygons)
    lo, hi = everything.min(axis=0), everything.max(axis=0)
    clipped = None
    if lo[0] < -_TOLERANCE or lo[1] < -_TOLERANCE or hi[0] > width + _TOLERANCE or hi[1] > height + _TOLERANCE:
        clipped = (
            f"{name}: annotation reaches outside the {width}x{height} slide "
            f"(x {lo[0]:.1f}..{hi[0]:.1f}, y {lo[1]:.1f}..{hi[1]:.1f}); clipped to the slide"
        )
    mask = np.zeros((height, width), dtype=np.uint8)
    for polygon in polygons:
        if clipped is not None:
            # Far-away coordinates would overflow OpenCV's fixed point: clip the polygon, not its vertices.
            polygon = clip_polygon(polygon, -1.0, -1.0, width + 1.0, height + 1.0)
            if len(polygon) < 3:
                continue
        fixed = np.rint(polygon * (1 << _SHIFT) - (1 << (_SHIFT - 1))).astype(np.int32)
        cv2.fillPoly(mask, [fixed.reshape(-1, 1, 2)], 255, lineType=cv2.LINE_8, shift=_SHIFT)
    if not mask.any():
        raise AnnotationError(f"{name}: the annotation's shapes enclose no pixel inside the {width}x{height} slide")
    return RasterisedAnnotation(mask=mask, shapes=shapes, clipped=clipped)
