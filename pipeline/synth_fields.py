"""Random fields and point sets for the synthetic slides of `gastric-fl synth` (`pipeline.synth_render`).

Smooth value noise, pixel noise, collagen-like fibres and the tissue piece's outline are the textures every slide is
painted from; jittered grids, dart throwing and mask look-ups place glands and cells. Every function draws only from
the generator it is given, in a fixed order, so a slide's seed fixes its bytes.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]
U8 = NDArray[np.uint8]
Bool = NDArray[np.bool_]


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
