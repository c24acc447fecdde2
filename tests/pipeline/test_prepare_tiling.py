"""Tiling maths (`pipeline.tiling`) and image normalisation (`pipeline.images`), with hand-computed values."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
import tifffile
from support.checks import every

from pipeline.config import build_config
from pipeline.images import ImageReadError, read_mask, read_rgb, to_rgb
from pipeline.tiling import (
    HospitalPlan,
    SlideTiles,
    cut_tiles,
    extract_region,
    hospital_plans,
    near_white,
    square_fractions,
)


def test_near_white_needs_every_channel_at_the_level() -> None:
    pixels = np.array([[[220, 220, 220], [219, 255, 255], [255, 255, 255], [230, 221, 250]]], dtype=np.uint8)
    assert near_white(pixels, 220).tolist() == [[True, False, True, True]]
    assert near_white(pixels, 225).tolist() == [[False, False, True, False]]


def test_white_ratios_of_unequal_tiles_by_hand() -> None:
    white = np.zeros((4, 8), dtype=bool)
    white[0, 0:3] = True  # left 4x4 square: 3 white pixels
    white[:, 5:7] = True  # right square: 8 white pixels ...
    white[3, 4:6] = True  # ... plus (3,4) (3,5 already counted): 9
    xs, ys, ratios = square_fractions(white, 4, 4)
    assert (xs, ys) == ([0, 4], [0])
    assert ratios.tolist() == [[3 / 16, 9 / 16]]
    xs, _, ratios = square_fractions(white, 4, 2)
    # Middle square x 2..5: (0,2), column 5 (4 px), (3,4) -> 6.
    assert xs == [0, 2, 4]
    assert ratios.tolist() == [[3 / 16, 6 / 16, 9 / 16]]
    assert square_fractions(white, 5, 5)[2].shape == (0, 1)  # taller than the slide: no tile


def test_extract_region_whitens_outside_the_mask_only() -> None:
    image = np.full((2, 3, 3), 100, dtype=np.uint8)
    mask = np.array([[True, False, True], [False, False, True]])
    out = extract_region(image, mask)
    assert out[mask].tolist() == [[100] * 3] * 3
    assert (out[~mask] == 255).all()
    assert (image == 100).all()  # the input is not modified


def _plan(grayscale: bool = False) -> HospitalPlan:
    return HospitalPlan(hospital=0, tile_px=4, scale=1.0, size=4, stride=4, abnormal_stride=4, grayscale=grayscale)


def _cut(
    image: np.ndarray,
    mask: np.ndarray | None,
    abnormal: bool,
    plan: HospitalPlan,
    *,
    background_max: float = 0.5,
    coverage: float = 0.5,
    masked: bool = False,
    white_max: float = 1.0,
    max_tiles: int | None = None,
    rng: np.random.Generator | None = None,
) -> SlideTiles:
    return cut_tiles(
        image,
        mask,
        abnormal,
        plan,
        background_max=background_max,
        white_level=220,
        abnormal_coverage=coverage,
        max_tiles=max_tiles,
        rng=np.random.default_rng(0) if rng is None else rng,
        masked=masked,
        white_max=white_max,
    )


def test_raw_tiles_are_labelled_by_the_masks_coverage_of_their_tissue() -> None:
    """Hand-made slide: five 4x4 squares; the label comes from the annotated share of each square's tissue."""
    image = np.full((4, 20, 3), 120, dtype=np.uint8)
    image[:, 8:12] = 250  # third square: glass (near-white), dropped by the white filter whatever its mask
    image[0:2, 12:16] = 250  # fourth square: half glass; its 8 tissue pixels are all annotated
    mask = np.zeros((4, 20), dtype=bool)
    mask[:, 0:4] = True  # first square: all tissue annotated -> abnormal
    mask[0:1, 4:8] = True  # second square: 4 of 16 tissue pixels annotated (0.25) -> left out at coverage 0.5
    mask[:, 8:12] = True
    mask[2:4, 12:16] = True  # fourth: 8 of 8 tissue pixels -> abnormal (coverage 1.0, white ratio 0.5)
    # fifth square: no annotation on an abnormal slide -> left out (normal tiles come from normal slides only)
    cut = _cut(image, mask, True, _plan())
    assert [(t.x, t.white_ratio) for t in cut.tiles] == [(0, 0.0), (12, 0.5)]
    assert cut.left_out == 2  # the second and the fifth square
    # Every tile is raw: no pixel was painted white.
    assert (cut.tiles[0].pixels == 120).all()
    assert (cut.tiles[1].pixels[:2] == 250).all()
    assert (cut.tiles[1].pixels[2:] == 120).all()
    # A lower coverage threshold takes the second square in; a stricter white filter drops the fourth.
    assert [t.x for t in _cut(image, mask, True, _plan(), coverage=0.25).tiles] == [0, 4, 12]
    assert [t.x for t in _cut(image, mask, True, _plan(), background_max=0.49).tiles] == [0]
    # A normal slide: every square with tissue, raw, whatever a mask would say; gray for a gray hospital.
    normal = _cut(image, None, False, _plan(grayscale=True))
    assert [t.x for t in normal.tiles] == [0, 4, 12, 16]
    assert normal.left_out == 0
    assert normal.tiles[0].pixels.shape == (4, 4)


def test_step_a1_is_applied_only_when_masked() -> None:
    image = np.full((4, 12, 3), 120, dtype=np.uint8)
    image[:, 8:12] = 250  # third square: background
    mask = np.zeros((4, 12), dtype=bool)
    mask[:, 0:4] = True
    mask[0:2, 4:8] = True  # second square half inside the cancer region
    kept = _cut(image, mask, True, _plan(), masked=True, white_max=0.5).tiles
    assert [(t.x, t.white_ratio) for t in kept] == [(0, 0.0), (4, 0.5)]
    assert (kept[1].pixels[2:] == 255).all()  # painted white outside the mask
    assert (kept[1].pixels[:2] == 120).all()
    strict = _cut(image, mask, True, _plan(), masked=True, white_max=0.49).tiles
    assert [t.x for t in strict] == [0]
    raw = _cut(image, mask, True, _plan()).tiles
    assert [t.x for t in raw] == [0, 4]  # the second square's tissue is half annotated: 0.5 >= 0.5
    assert not any((t.pixels == 255).any() for t in raw)


def test_max_tiles_per_slide_is_a_seeded_subset_in_raster_order() -> None:
    image = np.full((4, 40, 3), 120, dtype=np.uint8)
    first = _cut(image, None, False, _plan(), max_tiles=3, rng=np.random.default_rng([0, 7])).tiles
    again = _cut(image, None, False, _plan(), max_tiles=3, rng=np.random.default_rng([0, 7])).tiles
    xs = [t.x for t in first]
    assert len(xs) == 3
    assert xs == sorted(xs)
    assert xs == [t.x for t in again]
    assert set(xs) <= set(range(0, 40, 4))


def test_hospital_plans_scale_stride_and_tile_by_hand() -> None:
    config = build_config(
        None,
        {
            "split": {"clients": 3},
            "tiles": {"tile": 128, "stride": 64},
            "clients": {"tile": [128, 64, 100], "scale": [1.0, 0.5, 2.0], "grayscale": [1]},
        },
    )
    plans = hospital_plans(config)
    # (tile px, source px = tile/scale, stride: 64/128 of the client tile, abnormal stride: half that, in
    # source pixels)
    assert [(p.tile_px, p.size, p.stride, p.abnormal_stride, p.channels) for p in plans] == [
        (128, 128, 64, 32, 3),
        (64, 128, 64, 32, 1),
        (100, 50, 25, 12, 3),
    ]
    explicit = build_config(None, {"tiles": {"tile": 128, "abnormal_stride": 128}})
    assert {(p.stride, p.abnormal_stride) for p in hospital_plans(explicit)} == {(128, 128)}


def test_sixteen_bit_rgba_gray_and_planar_tiffs_normalise_to_rgb_uint8() -> None:
    sixteen = np.array([[[65535, 257, 0]]], dtype=np.uint16)
    assert to_rgb(sixteen, "x").tolist() == [[[255, 1, 0]]]
    rgba = np.array([[[100, 50, 0, 128], [10, 20, 30, 0]]], dtype=np.uint8)
    # 100*128/255 + 255*127/255 = 50.2 + 127.0 -> 177; alpha 0 -> white.
    assert to_rgb(rgba, "x").tolist() == [[[177, 152, 127], [255, 255, 255]]]
    gray = np.array([[7, 200]], dtype=np.uint8)
    assert to_rgb(gray, "x").tolist() == [[[7, 7, 7], [200, 200, 200]]]
    planar = np.arange(3 * 2 * 5, dtype=np.uint8).reshape(3, 2, 5)
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, planar, photometric="rgb", planarconfig="separate")
    assert np.array_equal(read_rgb(buffer.getvalue(), "p.tiff"), np.moveaxis(planar, 0, -1))
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, (np.ones((3, 4)) * 0.5).astype(np.float32))
    assert read_rgb(buffer.getvalue(), "f.tif")[0, 0].tolist() == [128, 128, 128]


def test_png_slides_come_back_in_rgb_order() -> None:
    rgb = np.zeros((2, 2, 3), dtype=np.uint8)
    rgb[..., 0] = 200  # red
    ok, png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    assert ok
    assert read_rgb(png.tobytes(), "r.png")[0, 0].tolist() == [200, 0, 0]


@pytest.mark.parametrize(
    ("data", "name", "message"),
    [
        (b"garbage", "x.png", "x.png: not a PNG, JPEG or TIFF image"),
        (b"\x89PNG\r\n\x1a\ngarbage", "x.png", "x.png: cannot decode image"),
        (b"II*\x00garbage", "x.tiff", "x.tiff: cannot decode image"),
    ],
)
def test_undecodable_files_raise_naming_the_file(data: bytes, name: str, message: str) -> None:
    with pytest.raises(ImageReadError, match=message):
        read_rgb(data, name)


def test_colour_masks_are_refused_and_gray_saved_as_rgb_is_accepted() -> None:
    colour = np.zeros((2, 2, 3), dtype=np.uint8)
    colour[0, 0] = (255, 0, 0)
    ok, png = cv2.imencode(".png", colour)
    assert ok
    with pytest.raises(ImageReadError, match=r"m\.png: mask has colour"):
        read_mask(png.tobytes(), "m.png")
    grey = np.repeat(np.array([[0, 255]], dtype=np.uint8)[:, :, None], 3, axis=2)
    ok, png = cv2.imencode(".png", grey)
    assert read_mask(png.tobytes(), "m.png").tolist() == [[0, 255]]


@pytest.mark.parametrize("compression", ["lzw", "zlib", "jpeg"])
def test_scanner_tiff_codecs_decode(compression: str) -> None:
    rgb = np.zeros((16, 24, 3), dtype=np.uint8)
    rgb[:, :12] = (200, 100, 150)
    buffer = io.BytesIO()
    tifffile.imwrite(buffer, rgb, photometric="rgb", compression=compression)
    decoded = read_rgb(buffer.getvalue(), "scan.tiff")
    assert decoded.shape == (16, 24, 3)
    error = np.abs(decoded.astype(int) - rgb.astype(int))
    if compression == "jpeg":  # lossy: close on average (ringing at the colour edge)
        assert error.mean() < 4
        assert decoded[8, 4].tolist() != decoded[8, 20].tolist()
    else:
        assert error.max() == 0


def test_whitening_only_kept_tiles_equals_extracting_the_whole_slide_first() -> None:
    rng = np.random.default_rng(9)
    image = rng.integers(150, 256, size=(40, 56, 3), dtype=np.uint8)
    mask = np.zeros((40, 56), dtype=bool)
    mask[5:33, 9:50] = True
    mask[20:25, 15:20] = False
    plan = HospitalPlan(hospital=0, tile_px=8, scale=1.0, size=8, stride=8, abnormal_stride=4, grayscale=False)
    lazy = _cut(image, mask, True, plan, masked=True, white_max=0.3).tiles
    # The eager reference: the whitened slide tiled on the abnormal grid against the same limit.
    eager_plan = HospitalPlan(hospital=0, tile_px=8, scale=1.0, size=8, stride=4, abnormal_stride=4, grayscale=False)
    eager = _cut(extract_region(image, mask), None, True, eager_plan, background_max=0.3).tiles
    assert len(lazy) > 5
    assert [(t.x, t.y, t.white_ratio) for t in lazy] == [(t.x, t.y, t.white_ratio) for t in eager]
    assert every(np.array_equal(a.pixels, b.pixels) for a, b in zip(lazy, eager, strict=True))
