"""Paint synthetic H&E gastric mucosa, normal or carcinomatous, for `gastric-fl synth`.

Stand-in for the SEED and BOT slides of the FedSAF paper (001, Sec. 4.1, Table 2), which the product never
downloads. The slide is painted as two stain concentration maps, haematoxylin (nuclei, some cytoplasm) and eosin
(stroma, cytoplasm), and turned into RGB with the Beer-Lambert law using Macenko et al.'s reference stain vectors,
the same model stain-normalisation methods invert; this is what makes the colours read as H&E rather than as
pink and purple paint.

Normal mucosa: glands (a ring of columnar epithelium with basal, evenly spaced, elongated nuclei around a pale
lumen) in a fibrous eosinophilic stroma with scattered lymphocytes, plasma cells and spindle cells, white
background and tears. Inside a *zone* of atypia strength ``s`` (1 = frank carcinoma) glands become crowded,
irregular, broken, cribriform or solid, epithelium stratifies, and nuclei grow larger, rounder, pleomorphic,
hyperchromatic and lose their polarity. Weak zones (small ``s``) imitate reactive atypia on normal slides.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np
from numpy.typing import NDArray

from pipeline.synth_patterns import Look

F32 = NDArray[np.float32]
U8 = NDArray[np.uint8]
Bool = NDArray[np.bool_]

# Macenko et al. (2009) reference stain vectors: RGB optical density per unit concentration.
STAIN_H = np.array([0.5626, 0.7201, 0.4062], np.float32)
STAIN_E = np.array([0.2159, 0.8012, 0.5581], np.float32)
# Haemoglobin in red blood cells reads orange-red, brighter than eosin-stained stroma.
STAIN_RBC = np.array([0.10, 1.05, 0.85], np.float32)
# Nucleus darkness is stored in a uint8 canvas: value = darkness * _DARK_SCALE (darkness 1 = typical nucleus).
_DARK_SCALE = 140.0
_SHIFT = 4
_ONE = 1 << _SHIFT
# Intracellular mucin (goblet cells, signet-ring cells) in the lumen canvas: mostly clear, with a little of the
# underlying eosin and haematoxylin showing, pale grey-blue rather than the glass-white of an empty lumen.
_MUCIN = 185


@dataclass(frozen=True)
class Zone:
    """An area that departs from normal mucosa: ``mask`` (bool, slide-sized) and strength ``s`` in [0, 1].

    ``look`` None: the built-in atypia of strength ``s`` (`Look.atypia`); else the pattern's own look
    (`pipeline.synth_patterns`).
    """

    mask: Bool
    s: float
    look: Look | None = None

    @property
    def appearance(self) -> Look:
        """What the zone looks like."""
        return Look.atypia(self.s) if self.look is None else self.look


@dataclass(frozen=True)
class Palette:
    """Per-slide staining: gains on each stain (labs and scanners differ) and the background optical density."""

    h_gain: float = 1.0
    e_gain: float = 1.0
    background: float = 0.03


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


def _blur(img: NDArray[np.float32], sigma_x: float, sigma_y: float | None = None) -> F32:
    """Gaussian blur that keeps float32 (typed: OpenCV's stubs lose the dtype)."""
    return np.asarray(
        cv2.GaussianBlur(img, (0, 0), sigma_x, sigmaY=sigma_x if sigma_y is None else sigma_y), np.float32
    )


def _resize(img: NDArray[np.float32], size: int, interpolation: int) -> F32:
    return np.asarray(cv2.resize(img, (size, size), interpolation=interpolation), np.float32)


def _noise(rng: np.random.Generator, size: int, feature: float, octaves: int = 1) -> F32:
    """Smooth random field (value noise, unit variance) with features about ``feature`` pixels across."""
    # Sum the octaves on a coarse canvas (4 px per finest feature), then upsample once: same look, far cheaper.
    finest = max(feature / 2 ** (octaves - 1), 1.0)
    work = min(size, max(8, math.ceil(4 * size / finest)))
    out = np.zeros((work, work), np.float32)
    amp = 1.0
    for _ in range(octaves):
        cells = max(2, round(size / max(feature, 1.0))) + 1
        grid = rng.standard_normal((cells, cells), dtype=np.float32)
        out += amp * _resize(grid, work, cv2.INTER_CUBIC)
        feature /= 2
        amp *= 0.5
    out /= float(out.std()) or 1.0
    if work != size:
        out = _resize(out, size, cv2.INTER_LINEAR)
    return out


def _white_noise(rng: np.random.Generator, size: int, tile: int = 512) -> F32:
    """Zero-mean, unit-variance pixel noise (uniform: half the cost of Gaussian draws, and it is blurred or
    tiny anyway). Beyond ``tile`` pixels a tile repeats: far cheaper, and invisible at pixel scale."""
    side = min(size, tile)
    noise = rng.random((side, side), dtype=np.float32)
    noise -= np.float32(0.5)
    noise *= np.float32(math.sqrt(12.0))
    if size <= tile:
        return noise
    reps = -(-size // tile)
    return np.ascontiguousarray(np.tile(noise, (reps, reps))[:size, :size])


def _smooth(field: F32, sigma: float) -> F32:
    """Gaussian blur of a smooth map; wide blurs run on a quarter-resolution copy."""
    size = field.shape[0]
    if sigma < 4 or size < 256:
        return _blur(field, sigma)
    small = _resize(field, size // 4, cv2.INTER_AREA)
    small = _blur(small, sigma / 4)
    return _resize(small, size, cv2.INTER_LINEAR)


def _fibres(rng: np.random.Generator, size: int, unit: float) -> F32:
    """Wavy collagen-like streaks in [0, 1]: noise smeared along one axis, rotated and domain-warped."""
    # Built at half resolution: fibres are much wider than a pixel, and this is the costliest texture.
    half = max(64, size // 2)
    k = half / size
    streak = rng.standard_normal((half, half), dtype=np.float32)
    streak = _blur(streak, max(1.0, 3.0 * unit * k), max(0.5, 0.25 * unit * k))
    yy, xx = np.mgrid[0:half, 0:half].astype(np.float32)
    angle = rng.uniform(0, math.pi)
    c, s = math.cos(angle), math.sin(angle)
    warp = 5.0 * unit * k
    dx = _noise(rng, half, 30 * unit * k) * warp
    dy = _noise(rng, half, 30 * unit * k) * warp
    mid = half / 2
    map_x = (c * (xx - mid) - s * (yy - mid) + mid + dx).astype(np.float32)
    map_y = (s * (xx - mid) + c * (yy - mid) + mid + dy).astype(np.float32)
    fib = np.asarray(cv2.remap(streak, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT), np.float32)
    fib /= float(fib[::4, ::4].std()) or 1.0
    fib = _resize(fib, size, cv2.INTER_LINEAR)
    out: F32 = 0.5 + 0.5 * np.tanh(0.9 * fib)
    return out


def _tissue(rng: np.random.Generator, size: int, unit: float, cover: float) -> F32:
    """Soft tissue mask in [0, 1]: one large piece with ragged edges plus a few tears (white holes)."""
    big = _noise(rng, size, size * 0.5, octaves=3)
    thr = float(np.quantile(big[::8, ::8], 1.0 - cover))
    tears = _noise(rng, size, 10 * unit, octaves=2)
    tear_thr = float(np.quantile(tears[::8, ::8], rng.uniform(0.01, 0.04)))
    tissue = ((big > thr) & (tears > tear_thr)).astype(np.float32)
    return _blur(tissue, max(0.5, 0.25 * unit))


def _scatter(
    rng: np.random.Generator, pts: NDArray[np.float64], radii: NDArray[np.float64], spacing: float
) -> NDArray[np.intp]:
    """Greedy dart throwing: indices of candidates whose discs (radius x spacing) do not overlap accepted ones."""
    if len(pts) == 0:
        return np.zeros(0, np.intp)
    cell = 2 * float(radii.max()) * spacing
    grid: dict[tuple[int, int], list[int]] = {}
    keep: list[int] = []
    for i in range(len(pts)):
        x, y = pts[i]
        gx, gy = int(x // cell), int(y // cell)
        ok = True
        for ix in (gx - 1, gx, gx + 1):
            for iy in (gy - 1, gy, gy + 1):
                for j in grid.get((ix, iy), ()):
                    if math.hypot(x - pts[j, 0], y - pts[j, 1]) < (radii[i] + radii[j]) * spacing:
                        ok = False
                        break
                if not ok:
                    break
            if not ok:
                break
        if ok:
            keep.append(i)
            grid.setdefault((gx, gy), []).append(i)
    return np.array(keep, np.intp)


def _jittered_grid(rng: np.random.Generator, x0: float, y0: float, x1: float, y1: float, step: float) -> NDArray:
    """Blue-noise-like points: one per ``step``-sized cell, jittered within the cell."""
    xs = np.arange(x0, x1, step)
    ys = np.arange(y0, y1, step)
    if len(xs) == 0 or len(ys) == 0:
        return np.zeros((0, 2))
    gx, gy = np.meshgrid(xs, ys)
    pts = np.stack([gx.ravel(), gy.ravel()], axis=1)
    out: NDArray[np.float64] = pts + rng.uniform(0, step, pts.shape)
    return out


def _in_image(pts: NDArray[np.float64], size: int) -> NDArray[np.float64]:
    """The points that lie inside a ``size`` x ``size`` image."""
    inside: NDArray[np.float64] = pts[(pts[:, 0] >= 0) & (pts[:, 0] < size) & (pts[:, 1] >= 0) & (pts[:, 1] < size)]
    return inside


def _lookup(mask: NDArray, pts: NDArray[np.float64]) -> NDArray:
    """Mask values at (x, y) points, clipped to the image."""
    h, w = mask.shape[:2]
    xi = np.clip(pts[:, 0].astype(np.intp), 0, w - 1)
    yi = np.clip(pts[:, 1].astype(np.intp), 0, h - 1)
    out: NDArray = mask[yi, xi]
    return out


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


def render_tissue(
    rng: np.random.Generator,
    size: int,
    unit: float,
    zones: list[Zone],
    palette: Palette,
    aggregates: int = 0,
    fill: bool = True,
) -> U8:
    """An RGB ``size`` x ``size`` H&E image; ``unit`` is the radius of a normal epithelial nucleus in pixels.

    ``fill``: zones are solid tissue (no tears or ragged edge inside them), as the built-in carcinoma always was;
    False lets tears and the tissue's edge cross them like any other tissue, so that a zone is not marked by
    having no glass (`pipeline.synth_patterns`).
    """
    tissue = _tissue(rng, size, unit, cover=float(rng.uniform(0.86, 0.98)))
    zone_any = np.zeros((size, size), bool)
    # Per-pixel strength of the features that act outside the glands: stroma, cytoplasm, chromatin, infiltrate.
    maps = {k: np.zeros((size, size), np.float32) for k in ("stroma", "cytoplasm", "chroma", "infiltrate")}
    for zone in zones:
        zone_any |= zone.mask
        look = zone.appearance
        for key, strength in maps.items():
            strength[zone.mask] = np.maximum(strength[zone.mask], getattr(look, key))
    if fill:
        # Tumour fills its region: no background holes where carcinoma was annotated.
        tissue = np.maximum(tissue, zone_any.astype(np.float32))
    fib = _fibres(rng, size, unit)

    # Glands: normal mucosa everywhere, then each zone's atypical glands composited inside the zone only, so
    # carcinoma stops exactly at the annotated outline (normal glands crossing it appear cut, as in invasion).
    sections = [(1.0, 1.5), (1.6, 2.8)]
    elongation = sections[int(rng.random() < 0.35)]
    epi = np.zeros((size, size), np.uint8)
    lumen = np.zeros((size, size), np.uint8)
    nuc = np.zeros((size, size), np.uint8)
    normal_nuclei = _Nuclei()
    normal_glands = _make_glands(rng, size, unit, tissue > 0.5, Look(), elongation)
    _draw_glands(normal_glands, epi, lumen)
    for g in normal_glands:
        _gland_nuclei(rng, g, unit, normal_nuclei)
    _draw_nuclei(rng, nuc, normal_nuclei)
    for zone in zones:
        look = zone.appearance
        if look.glands and not (look.arch or look.nuclei or look.chroma or look.goblet or look.signet):
            continue  # the normal glands already drawn are this zone's (e.g. gastritis changes only the stroma)
        z_epi = np.zeros_like(epi)
        z_lumen = np.zeros_like(lumen)
        z_nuc = np.zeros_like(nuc)
        z_nuclei = _Nuclei()
        # Centres may lie a gland's radius outside the zone: glands straddling the outline are clipped by the
        # composite below, so gland density does not dip along the boundary.
        reach = _smooth(zone.mask.astype(np.float32), 4.0 * unit) > 0.02
        glands = _make_glands(rng, size, unit, reach, look, elongation) if look.glands else []
        _draw_glands(glands, z_epi, z_lumen)
        for g in glands:
            _gland_nuclei(rng, g, unit, z_nuclei)
        if look.signet > 0:
            _signet_cells(rng, size, unit, reach, look.signet, z_lumen, z_nuclei)
        _draw_nuclei(rng, z_nuc, z_nuclei)
        epi[zone.mask] = z_epi[zone.mask]
        lumen[zone.mask] = z_lumen[zone.mask]
        nuc[zone.mask] = z_nuc[zone.mask]

    free = (epi < 64) & (lumen < 64) & (tissue > 0.5)
    rbc = np.zeros((size, size), np.uint8)
    _vessels(rng, size, unit, free, lumen, rbc)
    free &= lumen < 64
    stroma_nuclei = _Nuclei()
    infiltrate = _smooth(maps["infiltrate"], 2.0 * unit) if maps["infiltrate"].any() else None
    _stroma_nuclei(rng, size, unit, free, maps["stroma"], aggregates, stroma_nuclei, infiltrate)
    _draw_nuclei(rng, nuc, stroma_nuclei)
    return _compose(rng, size, unit, tissue, fib, epi, lumen, nuc, rbc, maps["cytoplasm"], maps["chroma"], palette)


def _compose(
    rng: np.random.Generator,
    size: int,
    unit: float,
    tissue: F32,
    fib: F32,
    epi_u8: U8,
    lumen_u8: U8,
    nuc_u8: U8,
    rbc_u8: U8,
    cytoplasm: F32,
    chroma: F32,
    palette: Palette,
) -> U8:
    """Stain concentrations -> optical density (Beer-Lambert) -> RGB.

    The per-pixel arithmetic runs in bands of rows so that its temporaries stay in cache: at 2048 x 2048 a
    full-size temporary costs 16 MB and a trip through memory, and there are dozens of them.
    """
    f32 = np.float32
    zc = _smooth(cytoplasm, max(0.5, unit)) if cytoplasm.any() else None
    zk = zc if zc is not None and np.array_equal(chroma, cytoplasm) else None
    if zk is None and chroma.any():
        zk = _smooth(chroma, max(0.5, unit))
    # Two textures: a fine grain (chromatin, cytoplasm granules) and a cell-sized mottle (uneven stroma).
    grain = _blur(_white_noise(rng, size), max(0.6, 0.3 * unit))
    grain *= f32(1.0 / (float(grain[::4, ::4].std()) or 1.0))
    mottle = _noise(rng, size, 2.5 * unit, octaves=2)
    c_h = np.empty((size, size), f32)
    c_e = np.empty((size, size), f32)
    band = max(1, 65536 // size)
    for y in range(0, size, band):
        rows = slice(y, y + band)
        _stains(
            epi_u8[rows],
            lumen_u8[rows],
            nuc_u8[rows],
            tissue[rows],
            fib[rows],
            grain[rows],
            mottle[rows],
            None if zc is None else zc[rows],
            None if zk is None else zk[rows],
            c_h[rows],
            c_e[rows],
        )
    blur = max(0.45, 0.15 * unit)
    c_h = _blur(c_h, blur)
    c_e = _blur(c_e, blur)
    c_h *= f32(palette.h_gain)
    c_e *= f32(palette.e_gain)
    c_r = _blur(rbc_u8.astype(np.float32) * f32(1 / 255), blur) if rbc_u8.any() else None
    # Uneven illumination and a little sensor noise.
    light = _noise(rng, size, size / 24)
    light *= f32(0.01)
    light += f32(palette.background)
    shot = _white_noise(rng, size)
    shot *= f32(1.2)
    out = np.empty((size, size, 3), np.uint8)
    for y in range(0, size, band):
        rows = slice(y, y + band)
        od = np.empty_like(c_h[rows])
        for ch in range(3):
            np.multiply(c_h[rows], -STAIN_H[ch], out=od)
            od -= c_e[rows] * STAIN_E[ch]
            if c_r is not None:
                od -= c_r[rows] * STAIN_RBC[ch]
            od -= light[rows]
            cv2.exp(od, od)
            od *= f32(255.0)
            od += shot[rows]
            np.clip(od, 0, 255, out=od)
            out[rows, :, ch] = od
    return out


def _stains(
    epi_u8: U8,
    lumen_u8: U8,
    nuc_u8: U8,
    tissue: F32,
    fib: F32,
    grain: F32,
    mottle: F32,
    zc: F32 | None,
    zk: F32 | None,
    c_h: F32,
    c_e: F32,
) -> None:
    """Haematoxylin and eosin concentrations of a band of rows, written into ``c_h`` and ``c_e``."""
    f32 = np.float32
    epi = epi_u8.astype(f32)
    epi *= f32(1 / 255)
    lum = lumen_u8.astype(f32)
    lum *= f32(1 / 255)
    nuc = nuc_u8.astype(f32)
    nuc *= f32(1 / _DARK_SCALE)
    stroma = 1.0 - epi
    stroma -= lum
    np.clip(stroma, 0.0, 1.0, out=stroma)
    tmp = np.empty_like(epi)
    # Eosin: fibrous, mottled stroma; lilac epithelium (a little less eosinophilic in carcinoma); faint mucus.
    np.multiply(fib, f32(0.3), out=c_e)
    c_e += f32(0.16)
    c_e *= stroma
    np.multiply(mottle, f32(0.18), out=tmp)
    tmp += f32(1.0)
    c_e *= tmp
    np.multiply(grain, f32(0.08 * 0.34), out=tmp)
    tmp += f32(0.34)
    if zc is not None:
        tmp -= zc * f32(0.05)
    tmp *= epi
    c_e += tmp
    np.multiply(mottle, f32(0.5 * 0.05), out=tmp)
    tmp += f32(0.05)
    np.maximum(tmp, 0.0, out=tmp)
    tmp *= lum
    c_e += tmp
    c_e *= tissue
    # Haematoxylin: faint in stroma, more in epithelium, most in (amphophilic) carcinoma cytoplasm.
    np.multiply(stroma, f32(0.05), out=c_h)
    np.multiply(mottle, f32(0.1 * 0.15), out=tmp)
    tmp += f32(0.15)
    if zc is not None:
        tmp += zc * f32(0.2)
    tmp *= epi
    c_h += tmp
    np.multiply(lum, f32(0.015), out=tmp)
    c_h += tmp
    c_h *= tissue
    # Nuclei replace what lies under them; chromatin is grainy, coarser in atypical nuclei.
    cover = nuc * f32(1.6)
    np.minimum(cover, 1.0, out=cover)
    if zk is not None:
        np.multiply(zk, f32(0.2), out=tmp)
        tmp += f32(0.16)
        tmp *= grain
    else:
        np.multiply(grain, f32(0.16), out=tmp)
    tmp += f32(1.0)
    np.clip(tmp, 0.6, 1.45, out=tmp)  # texture, not holes: chromatin never clears to white
    tmp *= nuc
    tmp *= f32(1.05)
    np.subtract(1.0, cover, out=stroma)
    c_h *= stroma
    c_h += tmp
    np.multiply(cover, f32(0.7), out=tmp)
    np.subtract(1.0, tmp, out=tmp)
    c_e *= tmp
