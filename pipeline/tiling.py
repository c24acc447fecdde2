"""Tiling and labelling (FedSAF paper 001, Sec. 4.2, Step b; Step a.1 only as a named departure).

**Raw tiles (the default).** Every tile, of either class and of every split, is cut from the slide's own pixels.
Step b's white-area filter measures the raw square, the same way for both classes: a square is kept when at most
``background_max`` of its pixels are near-white (glass, not tissue). A tile's label comes from the cancer mask's
coverage of its *tissue* (its pixels that are not near-white): on an abnormal slide a kept square is *abnormal*
when at least ``abnormal_coverage`` of its tissue lies inside the mask; squares below that (tissue partly or not
at all annotated) are *left out* and counted, since they are neither clearly cancer nor from a slide known to be
free of it. *Normal* tiles come only from slides whose mask is empty. So the pixels a model sees never carry
the label; only the annotation decides it (docs/pipeline.md, "Labels from coverage").

**Step a.1 as an option (``mask_outside``).** The paper whitens every pixel outside the cancer mask of an
abnormal slide and keeps a square when its white share, counting those pixels, is at most ``white_max``. Painted
pure white then occurs in almost every abnormal tile and in almost no normal one, a label written into the pixels
(the shortcut `pipeline.probe` measures). With ``mask_outside`` this applies to *training* tiles of abnormal slides
only; validation and test tiles are always raw (`cut_tiles`'s ``masked``).

Grayscale hospitals get single-channel tiles. A hospital with a simulated stain profile (`pipeline.stain_profiles`)
gets its tiles through that profile's stain and scanner steps; which tiles are kept never depends on it.

Definitions (docs/pipeline.md): a pixel is *near-white* when all three channels are >= ``white_level``
(default 220: slide glass and whited-out areas are ~240-255, H&E stroma and nuclei stay well below on at least
one channel). The white ratio of a tile is measured on the RGB pixels of its source region at the slide's
original resolution, before any resizing or grayscale conversion, so it means the same for every hospital.

Tile geometry: a hospital with scale ``s`` and tile ``t`` px takes squares of ``round(t / s)`` original pixels on
a grid with step ``round(stride / s)`` from the top-left corner (a partial square at the right/bottom edge is
not used) and resizes each to ``t x t``. ``x, y, size`` in the manifest are that square in original pixels.
Abnormal slides use ``abnormal_stride`` (default: half the stride, i.e. tiles overlapping by half): cancer
regions cover a fraction of a slide, and overlap roughly quadruples the abnormal tiles a slide yields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from pipeline.config import PrepareConfig
from pipeline.images import RGBImage
from pipeline.stain_profiles import StainProfile, apply_stain_profile, stain_profiles_for

WHITE = 255
# A slide whose every sample is at most this dark holds no tissue (a failed scan or a blank export); its squares pass
# the white-area filter all the same, so prepare and predict say so instead of tiling it silently.
BLACK_LEVEL = 10


@dataclass(frozen=True)
class HospitalPlan:
    """One hospital's tile settings: output tile px, scanning scale, grid in original pixels, colour."""

    hospital: int
    tile_px: int
    scale: float
    size: int
    stride: int
    abnormal_stride: int
    grayscale: bool
    # The hospital's simulated stain and scanner (None: tiles as cut). Prepare only; predict never sets it.
    stain_profile: StainProfile | None = None

    @property
    def channels(self) -> int:
        """1 for grayscale hospitals, 3 otherwise."""
        return 1 if self.grayscale else 3


@dataclass(frozen=True)
class Tile:
    """A kept tile: its square in original slide pixels, white ratio and output pixels."""

    x: int
    y: int
    size: int
    white_ratio: float
    pixels: npt.NDArray[np.uint8]


def hospital_plans(config: PrepareConfig) -> list[HospitalPlan]:
    """Every hospital's tile settings from ``--tile``, ``--stride``, ``--client-tile``, ``--client-scale``."""
    tiles, hospitals = config.tiles, config.clients
    sites = config.sites
    profiles = stain_profiles_for(sites.shift, sites.strength, sites.profile, config.split.seed, config.split.clients)
    plans = []
    for c in range(config.split.clients):
        tile_px = hospitals.tile[c] if hospitals.tile else tiles.tile
        scale = hospitals.scale[c] if hospitals.scale else 1.0
        # Strides are fractions of the base tile, so they keep the same overlap for every client's tile size.
        stride = tiles.tile if tiles.stride is None else tiles.stride
        abnormal = max(1, stride // 2) if tiles.abnormal_stride is None else tiles.abnormal_stride
        stride_px = max(1, round(stride * tile_px / tiles.tile))
        abnormal_px = max(1, round(abnormal * tile_px / tiles.tile))
        plans.append(
            HospitalPlan(
                hospital=c,
                tile_px=tile_px,
                scale=scale,
                size=max(1, round(tile_px / scale)),
                stride=max(1, round(stride_px / scale)),
                abnormal_stride=max(1, round(abnormal_px / scale)),
                grayscale=c in hospitals.grayscale,
                stain_profile=profiles[c],
            )
        )
    return plans


def extract_region(image: RGBImage, mask: npt.NDArray[np.bool_]) -> RGBImage:
    """Step a.1: a copy of ``image`` with every pixel outside ``mask`` set to white."""
    out = image.copy()
    out[~mask] = WHITE
    return out


def near_white(image: RGBImage, white_level: int) -> npt.NDArray[np.bool_]:
    """Pixels whose three channels are all >= ``white_level``."""
    # cv2.inRange is ~25x faster than image.min(axis=2) on a 2048x2048 slide (a strided 3-element reduction).
    level = (white_level, white_level, white_level)
    return np.asarray(cv2.inRange(image, level, (255, 255, 255)) > 0)


def is_black(image: RGBImage) -> bool:
    """Whether every sample of ``image`` is at most `BLACK_LEVEL` (a black slide: no tissue, yet not near-white)."""
    return image.size > 0 and int(image.max()) <= BLACK_LEVEL


def square_fractions(
    binary: npt.NDArray[np.bool_], size: int, stride: int
) -> tuple[list[int], list[int], npt.NDArray[np.float64]]:
    """Grid positions and the share of true pixels in every ``size`` square on it (one integral image, no per-tile
    sums)."""
    height, width = binary.shape
    xs = list(range(0, width - size + 1, stride))
    ys = list(range(0, height - size + 1, stride))
    if not xs or not ys:
        return xs, ys, np.zeros((len(ys), len(xs)), dtype=np.float64)
    # Float64 sums are exact for any slide below 2**53 pixels; the bool map is viewed as 0/1 bytes, no copy.
    integral = cv2.integral(np.ascontiguousarray(binary).view(np.uint8), sdepth=cv2.CV_64F)
    ya, xa = np.asarray(ys), np.asarray(xs)
    sums = (
        integral[np.ix_(ya + size, xa + size)]
        - integral[np.ix_(ya, xa + size)]
        - integral[np.ix_(ya + size, xa)]
        + integral[np.ix_(ya, xa)]
    )
    return xs, ys, sums / float(size * size)


def grid_coverage(
    white: npt.NDArray[np.bool_], mask: npt.NDArray[np.bool_], size: int, stride: int
) -> tuple[list[int], list[int], npt.NDArray[np.float64]]:
    """Grid positions and, per square, the share of its tissue (pixels not near-white) inside ``mask`` (0 where it
    has no tissue): the label rule of the module docstring, shared by prepare and predict's ground truth."""
    xs, ys, tissue = square_fractions(~white, size, stride)
    _, _, annotated = square_fractions(mask & ~white, size, stride)
    safe = np.where(tissue > 0, tissue, 1.0)
    return xs, ys, np.where(tissue > 0, annotated / safe, 0.0)


@dataclass(frozen=True)
class Positions:
    """The squares of one slide that Step b keeps, in raster order, and how many were left out between labels.

    ``kept``: ``(y, x, white_ratio)``; ``white_ratio`` is the raw square's near-white share, or (Step a.1,
    ``mask_outside``) its share counting pixels outside the mask as white. ``left_out``: squares of an abnormal
    slide that passed the white filter but whose tissue is less than ``abnormal_coverage`` inside the mask.
    """

    kept: list[tuple[int, int, float]]
    left_out: int = 0


def slide_positions(
    image: RGBImage,
    mask: npt.NDArray[np.bool_] | None,
    abnormal: bool,
    plan: HospitalPlan,
    *,
    background_max: float,
    white_level: int,
    abnormal_coverage: float,
    masked: bool = False,
    white_max: float = 1.0,
) -> Positions:
    """Step b's filter and the label rule (module docstring) for one slide.

    A normal slide, or an abnormal one without a mask, is measured raw on the ``stride`` grid against
    ``background_max`` (every kept square has the slide's label). An abnormal slide with a mask is measured on the
    ``abnormal_stride`` grid: raw against ``background_max``, then kept only where at least ``abnormal_coverage`` of
    the square's tissue is annotated; with ``masked`` (Step a.1, training tiles under ``--mask-outside``) as the
    paper does: pixels outside the mask count as white, against ``white_max``. ``gastric-fl predict`` tiles a
    whole slide with ``abnormal=False``, exactly as prepare tiles a normal one.
    """
    white = near_white(image, white_level)
    if not abnormal or mask is None:
        xs, ys, ratios = square_fractions(white, plan.size, plan.stride)
        return Positions(_kept(xs, ys, ratios, ratios <= background_max))
    stride = plan.abnormal_stride
    if masked:
        xs, ys, ratios = square_fractions(white | ~mask, plan.size, stride)
        return Positions(_kept(xs, ys, ratios, ratios <= white_max))
    xs, ys, ratios = square_fractions(white, plan.size, stride)
    tissue_ok = ratios <= background_max
    covered = grid_coverage(white, mask, plan.size, stride)[2] >= abnormal_coverage
    return Positions(_kept(xs, ys, ratios, tissue_ok & covered), int(np.count_nonzero(tissue_ok & ~covered)))


def _kept(
    xs: list[int], ys: list[int], ratios: npt.NDArray[np.float64], keep: npt.NDArray[np.bool_]
) -> list[tuple[int, int, float]]:
    """``(y, x, white_ratio)`` of the grid squares ``keep`` marks, in raster order."""
    return [(ys[i], xs[j], float(ratios[i, j])) for i, j in zip(*np.nonzero(keep), strict=True)]


def kept_positions(
    image: RGBImage, plan: HospitalPlan, background_max: float, white_level: int
) -> list[tuple[int, int, float]]:
    """``(y, x, white_ratio)`` of every square of a whole slide that prepare keeps from a normal slide (predict)."""
    positions = slide_positions(
        image, None, False, plan, background_max=background_max, white_level=white_level, abnormal_coverage=1.0
    )
    return positions.kept


def cut_square(
    image: RGBImage, region: npt.NDArray[np.bool_] | None, x: int, y: int, plan: HospitalPlan
) -> npt.NDArray[np.uint8]:
    """The output pixels of the square at ``(x, y)``: whitened outside ``region`` (Step a.1, when given), resized
    to ``plan.tile_px`` (``INTER_AREA`` shrinking, ``INTER_LINEAR`` enlarging), through the hospital's simulated
    stain profile when it has one, and gray for a gray hospital."""
    square: npt.NDArray[np.uint8] = image[y : y + plan.size, x : x + plan.size]
    if region is not None:
        inside = region[y : y + plan.size, x : x + plan.size, None]
        square = np.where(inside, square, np.uint8(WHITE))
    if plan.size != plan.tile_px:
        shrink = plan.size > plan.tile_px
        resized = cv2.resize(
            square, (plan.tile_px, plan.tile_px), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        )
        square = np.asarray(resized, dtype=np.uint8)
    if plan.stain_profile is not None:
        return apply_stain_profile(np.ascontiguousarray(square), plan.stain_profile, plan.grayscale)
    pixels = cv2.cvtColor(square, cv2.COLOR_RGB2GRAY) if plan.grayscale else np.ascontiguousarray(square)
    return np.asarray(pixels, dtype=np.uint8)


@dataclass(frozen=True)
class SlideTiles:
    """One slide's kept tiles and the count of squares left out between the labels (`Positions.left_out`)."""

    tiles: list[Tile]
    left_out: int


def cut_tiles(
    image: RGBImage,
    mask: npt.NDArray[np.bool_] | None,
    abnormal: bool,
    plan: HospitalPlan,
    *,
    background_max: float,
    white_level: int,
    abnormal_coverage: float,
    max_tiles: int | None,
    rng: np.random.Generator,
    masked: bool = False,
    white_max: float = 1.0,
) -> SlideTiles:
    """`slide_positions` then the cut, for one slide, in raster order (at most ``max_tiles``, drawn by ``rng``).

    With ``masked`` (Step a.1; training tiles of an abnormal slide under ``--mask-outside``) the same result as
    tiling `extract_region`'s output, but only kept tiles are whitened. Otherwise every tile is raw.
    """
    positions = slide_positions(
        image,
        mask,
        abnormal,
        plan,
        background_max=background_max,
        white_level=white_level,
        abnormal_coverage=abnormal_coverage,
        masked=masked,
        white_max=white_max,
    )
    kept = positions.kept
    if max_tiles is not None and len(kept) > max_tiles:
        chosen = np.sort(rng.choice(len(kept), size=max_tiles, replace=False))
        kept = [kept[int(k)] for k in chosen]
    region = mask if (abnormal and masked) else None
    tiles = [
        Tile(x=x, y=y, size=plan.size, white_ratio=ratio, pixels=cut_square(image, region, x, y, plan))
        for y, x, ratio in kept
    ]
    return SlideTiles(tiles, positions.left_out)


def tile_name(slide_index: int, source: str, x: int, y: int) -> str:
    """A unique, stable file name: slide index (slides may share a stem across folders) + stem + position."""
    stem = source.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:60] or "slide"
    return f"{slide_index:05d}_{safe}_x{x:05d}_y{y:05d}.png"
