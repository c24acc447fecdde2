"""Glands, nuclei and vessels of the synthetic H&E slides (`pipeline.synth_render`), drawn into uint8 canvases.

Normal mucosa: glands (a ring of columnar epithelium with basal, evenly spaced, elongated nuclei around a pale
lumen) in a stroma with scattered lymphocytes, plasma cells and spindle cells. With atypia of strength ``s`` (a
`pipeline.synth_patterns.Look`) glands become crowded, irregular, broken, cribriform or solid, epithelium
stratifies, and nuclei grow larger, rounder, pleomorphic, hyperchromatic and lose their polarity. Shapes are drawn
with OpenCV at sub-pixel precision (``_SHIFT`` fractional bits) and anti-aliased.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np
from numpy.typing import NDArray

from pipeline.synth_fields import F32, U8, Bool, _in_image, _jittered_grid, _lookup, _scatter
from pipeline.synth_patterns import Look

# Nucleus darkness is stored in a uint8 canvas: value = darkness * _DARK_SCALE (darkness 1 = typical nucleus).
_DARK_SCALE = 140.0
_SHIFT = 4
_ONE = 1 << _SHIFT
# Intracellular mucin (goblet cells, signet-ring cells) in the lumen canvas: mostly clear, with a little of the
# underlying eosin and haematoxylin showing, pale grey-blue rather than the glass-white of an empty lumen.
_MUCIN = 185


@dataclass
class _Gland:
    cx: float
    cy: float
    a: float
    b: float
    phi: float
    amps: NDArray[np.float64]
    phases: NDArray[np.float64]
    thick: float
    kind: str  # "ring", "cribriform" or "solid"
    look: Look = field(default_factory=Look)
    wedge: tuple[float, float] | None = None
    holes: list[tuple[float, float, float]] = field(default_factory=list)
    goblets: list[tuple[float, float, float]] = field(default_factory=list)

    def profile(self, theta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Radial factor of the outline (1 = the plain ellipse); harmonics 2, 3, ... make it irregular."""
        k = np.arange(2, 2 + len(self.amps))[:, None]
        out: NDArray[np.float64] = 1.0 + (self.amps[:, None] * np.cos(k * theta[None, :] + self.phases[:, None])).sum(0)
        return out

    def outline(self, inset: float, n: int = 48) -> NDArray[np.float64]:
        """Closed outline ``inset`` pixels inside the outer edge, as image coordinates (n x 2)."""
        theta = np.linspace(0.0, 2 * math.pi, n, endpoint=False)
        r = self.profile(theta)
        a = max(self.a - inset, 0.15 * self.a)
        b = max(self.b - inset, 0.15 * self.b)
        x, y = a * r * np.cos(theta), b * r * np.sin(theta)
        c, s = math.cos(self.phi), math.sin(self.phi)
        return np.stack([self.cx + c * x - s * y, self.cy + s * x + c * y], axis=1)

    def inside(self, pts: NDArray[np.float64], inset: float) -> Bool:
        """Whether points lie inside the outline inset by ``inset`` pixels (the outline is star-shaped)."""
        c, s = math.cos(self.phi), math.sin(self.phi)
        dx, dy = pts[:, 0] - self.cx, pts[:, 1] - self.cy
        x, y = c * dx + s * dy, -s * dx + c * dy
        a = max(self.a - inset, 0.15 * self.a)
        b = max(self.b - inset, 0.15 * self.b)
        rho = np.hypot(x / a, y / b)
        inside: Bool = rho < self.profile(np.arctan2(y / b, x / a))
        return inside


@dataclass
class _Nuclei:
    """Nuclei to draw: centre, semi-axes (long, short), angle, darkness, outline jitter."""

    cx: list[NDArray[np.float64]] = field(default_factory=list)
    cy: list[NDArray[np.float64]] = field(default_factory=list)
    rl: list[NDArray[np.float64]] = field(default_factory=list)
    rs: list[NDArray[np.float64]] = field(default_factory=list)
    ang: list[NDArray[np.float64]] = field(default_factory=list)
    dark: list[NDArray[np.float64]] = field(default_factory=list)
    jit: list[NDArray[np.float64]] = field(default_factory=list)
    vesicular: list[NDArray[np.bool_]] = field(default_factory=list)

    def add(
        self,
        pts: NDArray[np.float64],
        rl: NDArray[np.float64],
        rs: NDArray[np.float64],
        ang: NDArray[np.float64],
        dark: NDArray[np.float64],
        jit: NDArray[np.float64],
        vesicular: NDArray[np.bool_] | None = None,
    ) -> None:
        if len(pts) == 0:
            return
        self.vesicular.append(np.zeros(len(pts), bool) if vesicular is None else vesicular)
        self.cx.append(pts[:, 0])
        self.cy.append(pts[:, 1])
        n = len(pts)
        for store, values in ((self.rl, rl), (self.rs, rs), (self.ang, ang), (self.dark, dark), (self.jit, jit)):
            store.append(np.broadcast_to(values, (n,)).astype(np.float64))


def _make_glands(
    rng: np.random.Generator, size: int, unit: float, allowed: Bool, look: Look, elongation: tuple[float, float]
) -> list[_Gland]:
    """Glands whose centres fall in ``allowed``; their architecture degrades with ``look.arch``."""
    s = look.arch
    base = unit * rng.uniform(6.0, 7.5) * (1.0 + 0.4 * s)
    area = float(allowed[::4, ::4].mean()) * size * size
    n_try = int(area / (math.pi * base * base) * (4 + 6 * s)) + 4
    pts = rng.uniform(0, size, (n_try, 2))
    pts = pts[_lookup(allowed, pts)]
    # Carcinoma: wildly variable gland sizes.
    sizes = base * np.exp(rng.normal(0.0, 0.16 + 0.2 * s, len(pts)))
    aspect_lo, aspect_hi = elongation
    aspect = rng.uniform(aspect_lo, aspect_hi, len(pts))
    a = sizes * np.sqrt(aspect)
    b = sizes / np.sqrt(aspect)
    # Normal glands sit side by side with a little stroma between; carcinoma crowds them back to back.
    spacing = 1.02 - 0.4 * s
    keep = _scatter(rng, pts, np.maximum(a, b) * 0.8 + 0.2 * np.minimum(a, b), spacing)
    main_axis = rng.uniform(0, math.pi)
    glands = []
    n_harm = 2 + round(4 * s)
    for i in keep:
        irregular = 0.06 + 0.2 * s
        amps = irregular * rng.uniform(0.3, 1.0, n_harm) / np.arange(1, n_harm + 1) ** 0.5
        phases = rng.uniform(0, 2 * math.pi, n_harm)
        phi = main_axis + rng.normal(0, 0.35) if aspect_hi > 1.8 else rng.uniform(0, math.pi)
        thick = unit * rng.uniform(3.3, 4.0) * (1.0 + 0.35 * s * rng.uniform(0.3, 1.0))
        roll = rng.random()
        kind = "solid" if roll < 0.25 * s else "cribriform" if roll < 0.4 * s else "ring"
        if kind == "ring" and thick > 0.62 * min(a[i], b[i]):
            # Too small for a lumen at this epithelial height: a thin gland, or an abortive solid nest.
            thick = 0.62 * float(min(a[i], b[i]))
            if thick < 2.4 * unit * (1.0 + 0.55 * s):
                kind = "solid"
        g = _Gland(
            float(pts[i, 0]), float(pts[i, 1]), float(a[i]), float(b[i]), float(phi), amps, phases, thick, kind, look
        )
        if kind == "ring" and rng.random() < 0.5 * s:
            g.wedge = (float(rng.uniform(0, 2 * math.pi)), float(rng.uniform(0.5, 1.6)))
        if kind == "cribriform":
            n_holes = int(rng.integers(3, 8))
            for _ in range(n_holes * 3):
                hx, hy = g.cx + rng.uniform(-g.a, g.a), g.cy + rng.uniform(-g.a, g.a)
                hr = unit * rng.uniform(1.0, 2.2)
                if g.inside(np.array([[hx, hy]]), inset=hr + 1.5 * unit)[0]:
                    g.holes.append((hx, hy, hr))
                if len(g.holes) >= n_holes:
                    break
        if kind == "ring" and look.goblet > 0:
            _add_goblets(rng, g, unit, look.goblet)
        glands.append(g)
    return glands


def _walk(ring: NDArray[np.float64]) -> tuple[float, Callable[[NDArray[np.float64]], NDArray[np.float64]]]:
    """A closed outline's length, and the points at given arc-length positions along it (n x 2)."""
    seg = np.linalg.norm(np.diff(ring, axis=0, append=ring[:1]), axis=1)
    cum = np.concatenate([[0.0], np.cumsum(seg)])
    closed = np.concatenate([ring, ring[:1]], axis=0)

    def along(pos: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.stack([np.interp(pos, cum, closed[:, 0]), np.interp(pos, cum, closed[:, 1])], axis=1)

    return float(seg.sum()), along


def _add_goblets(rng: np.random.Generator, g: _Gland, unit: float, share: float) -> None:
    """Goblet cells of intestinal metaplasia: clear mucin vacuoles in the apical half of a ring gland's epithelium,
    at about one in ``1 / share`` cell positions."""
    length, along = _walk(g.outline(0.52 * g.thick, n=96))
    radius = min(0.27 * g.thick, 1.4 * unit)
    n = max(3, int(length / (2.6 * radius)))
    pos = np.mod((np.arange(n) + rng.uniform(-0.15, 0.15, n)) * (length / n), length)
    keep = rng.random(n) < share
    pts = along(pos)[keep]
    sizes = radius * rng.uniform(0.8, 1.1, len(pts))
    g.goblets.extend(zip(pts[:, 0].tolist(), pts[:, 1].tolist(), sizes.tolist(), strict=True))


def _gland_nuclei(rng: np.random.Generator, g: _Gland, unit: float, out: _Nuclei) -> None:
    """Epithelial nuclei of one gland: a basal palisade when normal, stratified and disordered with atypia."""
    s = g.look.nuclei
    scale = unit * (1.0 + 0.55 * s)
    if g.kind == "ring":
        rows = 1 + int(rng.uniform(0, 1 + 1.4 * s))
        for row in range(rows):
            depth = g.thick * (0.28 + (0.42 * row / (rows - 1) if rows > 1 else 0.0))
            length, along = _walk(g.outline(depth, n=96))
            step = 2.0 * scale * (1.0 - 0.1 * s)
            n = max(3, int(length / step))
            pos = (np.arange(n) + rng.uniform(-0.2, 0.2, n)) * (length / n) + rng.uniform(0, step)
            pts = along(np.mod(pos, length))
            radial = np.arctan2(pts[:, 1] - g.cy, pts[:, 0] - g.cx)
            # Loss of polarity: the long axis stops pointing at the lumen and nuclei leave their row.
            ang = radial + rng.normal(0, 0.15 + 1.2 * s, n)
            shift = rng.normal(0, (0.04 + 0.25 * s) * g.thick, n)
            pts = pts + np.stack([np.cos(radial), np.sin(radial)], axis=1) * shift[:, None]
            if g.wedge is not None:
                rel = np.mod(np.arctan2(pts[:, 1] - g.cy, pts[:, 0] - g.cx) - g.wedge[0], 2 * math.pi)
                pts, ang = pts[rel > g.wedge[1]], ang[rel > g.wedge[1]]
            for hx, hy, hr in g.goblets:
                # A goblet cell's own nucleus is a thin basal sliver under its mucin: no columnar nucleus there.
                away = np.hypot(pts[:, 0] - hx, pts[:, 1] - hy) > hr + 0.3 * unit
                pts, ang = pts[away], ang[away]
            _add_epithelial(rng, pts, ang, scale, g.look, out)
    else:
        step = 2.45 * scale
        r = max(g.a, g.b) * 1.5
        pts = _jittered_grid(rng, g.cx - r, g.cy - r, g.cx + r, g.cy + r, step)
        pts = pts[g.inside(pts, inset=0.6 * unit)]
        for hx, hy, hr in g.holes:
            pts = pts[np.hypot(pts[:, 0] - hx, pts[:, 1] - hy) > hr + 0.8 * unit]
        _add_epithelial(rng, pts, rng.uniform(0, math.pi, len(pts)), scale, g.look, out)


def _add_epithelial(
    rng: np.random.Generator, pts: NDArray[np.float64], ang: NDArray[np.float64], scale: float, look: Look, out: _Nuclei
) -> None:
    n = len(pts)
    if n == 0:
        return
    s, h = look.nuclei, look.chroma
    pleo = np.exp(rng.normal(0, 0.07 + 0.22 * s, n))
    long = scale * (1.2 - 0.25 * s) * pleo
    short = scale * (0.58 + 0.22 * s) * pleo * np.exp(rng.normal(0, 0.05 + 0.1 * s, n))
    dark = (0.85 + 0.35 * h) * np.exp(rng.normal(0, 0.07 + 0.12 * h, n))
    # A few mitoses in carcinoma: small, very dark, ragged.
    mitosis = rng.random(n) < 0.03 * s
    dark[mitosis] *= 1.5
    jit = np.where(mitosis, 0.35, 0.03 + 0.14 * s)
    # Some carcinoma nuclei are vesicular: cleared chromatin, thick membrane, prominent nucleolus.
    vesicular = (rng.random(n) < 0.3 * s) & ~mitosis
    out.add(pts, long, short, ang, dark, jit, vesicular)


def _draw_glands(glands: list[_Gland], epi: U8, lumen: U8) -> None:
    for g in glands:
        outer = np.round(g.outline(0.0) * _ONE).astype(np.int32)
        cv2.fillPoly(epi, [outer], 255, cv2.LINE_AA, shift=_SHIFT)
        cv2.fillPoly(lumen, [outer], 0, cv2.LINE_AA, shift=_SHIFT)
        if g.kind == "ring":
            inner = np.round(g.outline(g.thick) * _ONE).astype(np.int32)
            cv2.fillPoly(epi, [inner], 0, cv2.LINE_AA, shift=_SHIFT)
            cv2.fillPoly(lumen, [inner], 255, cv2.LINE_AA, shift=_SHIFT)
            if g.wedge is not None:
                # A broken gland: a gap in the epithelial ring opens the lumen into the stroma.
                theta = np.linspace(g.wedge[0], g.wedge[0] + g.wedge[1], 12)
                far = 1.15 * max(g.a, g.b) * 1.4
                rim = np.stack([g.cx + far * np.cos(theta), g.cy + far * np.sin(theta)], axis=1)
                wedge = np.concatenate([[[g.cx, g.cy]], rim], axis=0)
                pts = np.round(wedge * _ONE).astype(np.int32)
                cv2.fillPoly(epi, [pts], 0, cv2.LINE_AA, shift=_SHIFT)
                cv2.fillPoly(lumen, [pts], 0, cv2.LINE_AA, shift=_SHIFT)
        # cribriform holes are empty lumina; goblet vacuoles hold mucin
        for circles, value in ((g.holes, 255), (g.goblets, _MUCIN)):
            for hx, hy, hr in circles:
                centre = (round(hx * _ONE), round(hy * _ONE))
                cv2.circle(epi, centre, round(hr * _ONE), 0, -1, cv2.LINE_AA, shift=_SHIFT)
                cv2.circle(lumen, centre, round(hr * _ONE), value, -1, cv2.LINE_AA, shift=_SHIFT)


def _stroma_nuclei(
    rng: np.random.Generator,
    size: int,
    unit: float,
    free: Bool,
    zone_s: F32,
    aggregates: int,
    out: _Nuclei,
    infiltrate: F32 | None = None,
) -> None:
    """Lamina propria cells (lymphocytes, plasma cells, spindle cells), lymphoid aggregates, stray tumour cells, and
    where ``infiltrate`` > 0 lymphocytes and plasma cells packed in with that probability per cell position."""
    pts = _jittered_grid(rng, 0, 0, size, size, 4.0 * unit)
    for _ in range(aggregates):
        cx, cy = rng.uniform(0, size, 2)
        radius = unit * rng.uniform(12, 28)
        blob = _jittered_grid(rng, cx - 2 * radius, cy - 2 * radius, cx + 2 * radius, cy + 2 * radius, 1.9 * unit)
        d = np.hypot(blob[:, 0] - cx, blob[:, 1] - cy) / radius
        pts = np.concatenate([pts, blob[rng.random(len(blob)) < np.exp(-(d**2))]], axis=0)
    pts = _in_image(pts, size)
    # Desmoplastic tumour stroma is more cellular than lamina propria.
    keep = 0.6 + 0.3 * _lookup(zone_s, pts)
    pts = pts[_lookup(free, pts) & (rng.random(len(pts)) < keep)]
    n = len(pts)
    kind = rng.choice(3, n, p=[0.5, 0.2, 0.3])
    long = np.choose(kind, [0.72, 0.9, 1.7]) * unit * np.exp(rng.normal(0, 0.08, n))
    short = np.choose(kind, [0.68, 0.7, 0.38]) * unit * np.exp(rng.normal(0, 0.08, n))
    dark = np.choose(kind, [1.2, 1.0, 0.95]) * np.exp(rng.normal(0, 0.08, n))
    jit = np.full(n, 0.04)
    s = _lookup(zone_s, pts).astype(np.float64)
    # Infiltrating single tumour cells in carcinoma stroma: enlarged, hyperchromatic, irregular.
    stray = rng.random(n) < 0.1 * s
    grow = 1.0 + 1.1 * s
    long = np.where(stray, unit * 1.15 * grow, long)
    short = np.where(stray, unit * 0.85 * grow, short)
    dark = np.where(stray, 1.0 + 0.5 * s, dark)
    jit = np.where(stray, 0.1 + 0.12 * s, jit)
    out.add(pts, long, short, rng.uniform(0, math.pi, n), dark, jit)
    if infiltrate is not None:
        # Chronic inflammation: small round lymphocytes and eccentric plasma cells, nearly touching at full strength.
        dense = _in_image(_jittered_grid(rng, 0, 0, size, size, 1.9 * unit), size)
        dense = dense[_lookup(free, dense) & (rng.random(len(dense)) < _lookup(infiltrate, dense))]
        m = len(dense)
        plasma = rng.random(m) < 0.35
        long = np.where(plasma, 0.9, 0.7) * unit * np.exp(rng.normal(0, 0.08, m))
        short = np.where(plasma, 0.7, 0.66) * unit * np.exp(rng.normal(0, 0.08, m))
        dark = np.where(plasma, 1.15, 1.5) * np.exp(rng.normal(0, 0.08, m))
        out.add(dense, long, short, rng.uniform(0, math.pi, m), dark, np.full(m, 0.04))


def _signet_cells(
    rng: np.random.Generator, size: int, unit: float, allowed: Bool, density: float, mucin: U8, out: _Nuclei
) -> None:
    """Poorly cohesive (signet-ring) carcinoma cells in ``allowed``: each a round vacuole of pale mucin (drawn into
    ``mucin``, painted like a lumen) with a dark crescent nucleus pressed against its edge; ``density``: the share
    of cell positions taken."""
    pts = _in_image(_jittered_grid(rng, 0, 0, size, size, 4.6 * unit), size)
    pts = pts[_lookup(allowed, pts) & (rng.random(len(pts)) < density)]
    n = len(pts)
    if n == 0:
        return
    radius = unit * rng.uniform(1.5, 2.2, n)
    for (x, y), r in zip(pts, radius, strict=True):
        centre = (round(x * _ONE), round(y * _ONE))
        cv2.circle(mucin, centre, round(r * _ONE), _MUCIN, -1, cv2.LINE_AA, shift=_SHIFT)
    side = rng.uniform(0, 2 * math.pi, n)
    centre = pts + 0.72 * radius[:, None] * np.stack([np.cos(side), np.sin(side)], axis=1)
    long = unit * rng.uniform(0.95, 1.3, n)
    short = unit * rng.uniform(0.32, 0.45, n)
    dark = 1.1 * np.exp(rng.normal(0, 0.1, n))
    out.add(centre, long, short, side + math.pi / 2, dark, np.full(n, 0.12))


def _draw_nuclei(rng: np.random.Generator, canvas: U8, nuclei: _Nuclei) -> None:
    if not nuclei.cx:
        return
    cx, cy = np.concatenate(nuclei.cx), np.concatenate(nuclei.cy)
    rl, rs = np.concatenate(nuclei.rl), np.concatenate(nuclei.rs)
    ang, dark, jit = np.concatenate(nuclei.ang), np.concatenate(nuclei.dark), np.concatenate(nuclei.jit)
    vesicular = np.concatenate(nuclei.vesicular)
    n, k = len(cx), 12
    theta = np.linspace(0, 2 * math.pi, k, endpoint=False)
    wob = rng.normal(0, 1, (n, k))
    wob = (np.roll(wob, 1, axis=1) + 2 * wob + np.roll(wob, -1, axis=1)) / 2.5
    r = np.clip(1.0 + jit[:, None] * wob, 0.5, 1.6)
    x = rl[:, None] * r * np.cos(theta)
    y = rs[:, None] * r * np.sin(theta)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    px = cx[:, None] + c * x - s * y
    py = cy[:, None] + s * x + c * y
    polys = np.round(np.stack([px, py], axis=2) * _ONE).astype(np.int32)
    values = np.clip(dark * _DARK_SCALE * np.where(vesicular, 0.6, 1.0), 1, 255).astype(np.int32)
    # A darker rim (the nuclear membrane) keeps overlapping nuclei distinguishable, as in real sections.
    rims = np.clip(dark * _DARK_SCALE * np.where(vesicular, 1.5, 1.3), 1, 255).astype(np.int32)
    # Below ~2 px a nucleus is mostly rim already: skip it, so small renders stay a faithful downscale.
    rimmed = float(np.median(rs)) >= 1.5
    thick = np.maximum(1, np.round(0.2 * rs)).astype(np.int32)
    dot = np.round(np.maximum(0.7, 0.25 * rs) * _ONE).astype(np.int32)
    centres = np.round(np.stack([cx, cy], axis=1) * _ONE).astype(np.int32)
    nucleolus = np.clip(dark * _DARK_SCALE * 1.7, 1, 255).astype(np.int32)
    for i in rng.permutation(n):
        cv2.fillPoly(canvas, [polys[i]], int(values[i]), cv2.LINE_AA, shift=_SHIFT)
        if not rimmed:
            continue
        if vesicular[i]:
            cv2.polylines(canvas, [polys[i]], True, int(rims[i]), int(thick[i]), cv2.LINE_AA, shift=_SHIFT)
            centre = (int(centres[i, 0]), int(centres[i, 1]))
            cv2.circle(canvas, centre, int(dot[i]), int(nucleolus[i]), -1, cv2.LINE_AA, shift=_SHIFT)
        else:
            cv2.polylines(canvas, [polys[i]], True, int(rims[i]), 1, cv2.LINE_AA, shift=_SHIFT)


def _vessels(rng: np.random.Generator, size: int, unit: float, free: Bool, lumen: U8, rbc: U8) -> None:
    """A few capillaries in the stroma: an empty slit with red blood cells."""
    count = rng.poisson(2.0 * (size / (120 * unit)) ** 2 / 4)
    for _ in range(count):
        cx, cy = rng.uniform(0, size, 2)
        if not free[int(cy), int(cx)]:
            continue
        ax, bx = unit * rng.uniform(3, 7), unit * rng.uniform(1.2, 2.2)
        ang = float(rng.uniform(0, 180))
        centre = (round(cx * _ONE), round(cy * _ONE))
        axes = (round(ax * _ONE), round(bx * _ONE))
        cv2.ellipse(lumen, centre, axes, ang, 0, 360, 255, -1, cv2.LINE_AA, shift=_SHIFT)
        for _ in range(int(rng.integers(2, 9))):
            t = rng.uniform(-0.7, 0.7)
            px = cx + t * ax * math.cos(math.radians(ang)) + rng.normal(0, 0.3 * bx)
            py = cy + t * ax * math.sin(math.radians(ang)) + rng.normal(0, 0.3 * bx)
            rr = round(unit * rng.uniform(0.75, 0.95) * _ONE)
            cv2.circle(rbc, (round(px * _ONE), round(py * _ONE)), rr, 255, -1, cv2.LINE_AA, shift=_SHIFT)
