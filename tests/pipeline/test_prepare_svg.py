"""SVG annotation -> mask (`pipeline.svgmask`): enclosed area whatever the fill, transforms applied, bad files named.

Convention under test (docs/pipeline.md): a pixel belongs to the region when its centre is inside a shape or
on its outline, so an axis-aligned rectangle from x0 to x1 covers columns x0..x1 inclusive.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.svgmask import AnnotationError, rasterise_svg


def _svg(body: str, width: int = 64, height: int = 48, extra: str = "") -> bytes:
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" {extra}>{body}</svg>'.encode()


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())


def test_outline_only_rect_inside_a_transformed_group_is_filled() -> None:
    body = (
        '<g transform="translate(5,7) scale(2)"><rect x="1" y="2" width="10" height="5" fill="none" stroke="#0f0"/></g>'
    )
    result = rasterise_svg(_svg(body), 64, 48, "a.svg")
    # (1,2)-(11,7) scaled by 2 then moved by (5,7): x 7..27, y 11..21.
    assert _bbox(result.mask) == (7, 11, 27, 21)
    assert int((result.mask > 0).sum()) == 21 * 11
    assert set(np.unique(result.mask)) == {0, 255}
    assert result.clipped is None


def test_curves_circles_and_rotated_ellipses_follow_their_geometry() -> None:
    body = (
        '<circle cx="20" cy="20" r="12" fill="none"/>'
        '<ellipse cx="0" cy="0" rx="10" ry="4" transform="translate(48,30) rotate(90)" style="fill:none;stroke:red"/>'
    )
    mask = rasterise_svg(_svg(body), 64, 48, "c.svg").mask > 0
    yy, xx = np.mgrid[0:48, 0:64] + 0.5
    circle = np.hypot(xx - 20, yy - 20)
    assert mask[circle < 11].all()
    assert not mask[(circle > 13) & (xx < 34)].any()
    # Rotated by 90 degrees: 4 wide (x), 10 tall (y).
    ellipse = ((xx - 48) / 4) ** 2 + ((yy - 30) / 10) ** 2
    assert mask[ellipse < 0.8].all()
    assert not mask[(ellipse > 1.3) & (xx > 34)].any()


def test_cubic_path_subpaths_and_open_polylines_are_each_filled() -> None:
    body = (
        '<path d="M 2 2 L 12 2 L 12 12 L 2 12 Z M 20 2 L 30 2 L 30 12 L 20 12 Z" fill="none"/>'
        '<polyline points="40,2 60,2 60,22" fill="none"/>'
        '<path d="M 2 30 C 2 20, 22 20, 22 30 Z"/>'
    )
    mask = rasterise_svg(_svg(body), 64, 48, "p.svg").mask > 0
    assert mask[2:13, 2:13].all()
    assert mask[2:13, 20:31].all()
    assert not mask[5, 16]
    # The open polyline is closed implicitly: the triangle (40,2)-(60,2)-(60,22).
    assert mask[4, 57]
    assert not mask[20, 42]
    # The cubic bump: top near y = 22.5 at x = 12, nothing above.
    assert mask[24, 12]
    assert mask[29, 4]
    assert not mask[21, 12]


def test_shapes_reaching_outside_are_clipped_and_reported() -> None:
    result = rasterise_svg(_svg('<rect x="50" y="-10" width="40" height="30"/>'), 64, 48, "big.svg")
    assert _bbox(result.mask) == (50, 0, 63, 20)
    assert result.clipped is not None
    assert result.clipped.startswith("big.svg: annotation reaches outside the 64x48")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"<svg><rect x='1'", "bad.svg: malformed SVG"),
        (b"not xml at all", "bad.svg: malformed SVG"),
        (_svg('<line x1="1" y1="1" x2="30" y2="30"/>'), "contains no closed shape"),
        (_svg("<title>empty</title>"), "contains no closed shape"),
        (_svg('<rect x="100" y="100" width="10" height="10"/>'), "enclose no pixel inside the 64x48 slide"),
        (_svg('<rect x="1" y="1" width="10" height="10"/>', width=128, height=96), "canvas is 128x96"),
        (_svg('<rect x="1" y="1" width="10" height="10"/>', extra='viewBox="0 0 32 24"'), "viewBox is 32x24"),
    ],
)
def test_unusable_annotations_raise_errors_naming_the_file(data: bytes, message: str) -> None:
    with pytest.raises(AnnotationError, match=message) as info:
        rasterise_svg(data, 64, 48, "bad.svg")
    assert str(info.value).startswith("bad.svg: ")
    assert "\n" not in str(info.value)
