"""The stain model of the synthetic slides (`pipeline.synth_render`): stain concentrations -> RGB.

Haematoxylin (nuclei, some cytoplasm) and eosin (stroma, cytoplasm) concentration maps are turned into RGB with the
Beer-Lambert law using Macenko et al.'s reference stain vectors, the same model stain-normalisation methods invert;
this is what makes the colours read as H&E rather than as pink and purple paint.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from pipeline.synth_cells import _DARK_SCALE
from pipeline.synth_fields import F32, U8, _blur, _noise, _smooth, _white_noise

# Macenko et al. (2009) reference stain vectors: RGB optical density per unit concentration.
STAIN_H = np.array([0.5626, 0.7201, 0.4062], np.float32)
STAIN_E = np.array([0.2159, 0.8012, 0.5581], np.float32)
# Haemoglobin in red blood cells reads orange-red, brighter than eosin-stained stroma.
STAIN_RBC = np.array([0.10, 1.05, 0.85], np.float32)


@dataclass(frozen=True)
class Palette:
    """Per-slide staining: gains on each stain (labs and scanners differ) and the background optical density."""

    h_gain: float = 1.0
    e_gain: float = 1.0
    background: float = 0.03


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
