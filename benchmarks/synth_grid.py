"""Draw docs/img/synth_grid.png: synthetic SEED and BOT slides (FedSAF paper 001, Sec. 4.1) with their masks.

Rows: 4 normal SEED slides beside their (black) masks; 4 abnormal SEED slides beside their masks; a BOT normal
slide, a BOT abnormal slide with its SVG annotation rasterised by svgelements and outlined in green, a 1:1 crop
of that slide and the rasterised annotation; one abnormal SEED slide at difficulty 0, 1/3, 2/3 and 1 (mask
outlined). Everything is read back from files written by ``generate_dataset``, as a user would see them.

Run: .venv/bin/python benchmarks/synth_grid.py [--out docs/img/synth_grid.png]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import cv2
import numpy as np
import svgelements as se
import tifffile
from numpy.typing import NDArray

from pipeline.synth import generate_dataset, plan_dataset, render_slide

Image = NDArray[np.uint8]
GREEN = (40, 200, 40)


def svg_mask(path: Path, size: int) -> Image:
    """Fill every closed subpath of every shape of an SVG annotation (transforms applied by svgelements)."""
    mask = np.zeros((size, size), np.uint8)
    for element in se.SVG.parse(str(path)).elements():
        if isinstance(element, se.Shape):
            for sub in abs(se.Path(element)).as_subpaths():
                pts = np.array(se.Path(sub).npoint(np.linspace(0.0, 1.0, 1000)), dtype=np.float64)
                cv2.fillPoly(mask, [np.round(pts * 16).astype(np.int32)], 255, lineType=cv2.LINE_AA, shift=4)
    return mask


def read_rgb(path: Path) -> Image:
    if path.suffix == ".tiff":
        return np.asarray(tifffile.imread(path), np.uint8)
    bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise SystemExit(f"cannot read {path}")
    return np.asarray(bgr[:, :, ::-1], np.uint8)


def read_gray(path: Path) -> Image:
    gray = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    if gray is None:
        raise SystemExit(f"cannot read {path}")
    return np.asarray(gray, np.uint8)


def panel(image: Image, side: int, label: str, outline: Image | None = None) -> Image:
    """Resize to ``side`` (area filter), optionally outline a mask, and write a label."""
    rgb = image if image.ndim == 3 else np.repeat(image[:, :, None], 3, axis=2)
    out = np.ascontiguousarray(cv2.resize(rgb, (side, side), interpolation=cv2.INTER_AREA), dtype=np.uint8)
    if outline is not None:
        small = cv2.resize(outline, (side, side), interpolation=cv2.INTER_NEAREST)
        contours, _ = cv2.findContours((small > 127).astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        cv2.drawContours(out, contours, -1, GREEN, 2, cv2.LINE_AA)
    (w, h), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, 0.45, 1)
    cv2.rectangle(out, (0, 0), (w + 8, h + 10), (255, 255, 255), -1)
    cv2.putText(out, label, (4, h + 5), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return out


def build(work: Path) -> Image:
    seed = generate_dataset(work / "seed", "seed", images=8, seed=2, abnormal_fraction=0.5)
    bot = generate_dataset(work / "bot", "bot", images=2, seed=1, abnormal_fraction=0.5)
    small, big = 160, 320
    rows: list[Image] = []
    for wanted in ("normal", "abnormal"):
        cells = []
        for plan in plan_dataset("seed", 8, seed=2, abnormal_fraction=0.5):
            if plan.abnormal == (wanted == "abnormal"):
                image = read_rgb(seed.out / f"{plan.slide_id}.png")
                mask = read_gray(seed.out / f"{plan.slide_id}_mask.png")
                cells += [panel(image, small, f"SEED {wanted}"), panel(mask, small, "mask")]
        rows.append(np.concatenate(cells, axis=1))

    normal = read_rgb(next((bot.out / "normal").glob("*.tiff")))
    tiff = next((bot.out / "abnormal").glob("*.tiff"))
    abnormal = read_rgb(tiff)
    annotation = svg_mask(tiff.with_suffix(".svg"), abnormal.shape[0])
    # A 1:1 crop centred on the annotation's boundary shows cell-level detail on both sides of it.
    edge = cv2.morphologyEx(annotation, cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8))
    ys, xs = np.nonzero(edge)
    right = int(np.argmax(xs))  # the outline's rightmost point: carcinoma on the left, normal mucosa on the right
    cy, cx = int(ys[right]), int(xs[right])
    half = big // 2
    cy = min(max(cy, half), abnormal.shape[0] - half)
    cx = min(max(cx, half), abnormal.shape[1] - half)
    crop = abnormal[cy - half : cy + half, cx - half : cx + half]
    crop_mask = annotation[cy - half : cy + half, cx - half : cx + half]
    rows.append(
        np.concatenate(
            [
                panel(normal, big, "BOT normal (2048 px)"),
                panel(abnormal, big, "BOT abnormal + SVG outline", annotation),
                panel(crop, big, "BOT 1:1 crop at the outline", crop_mask),
                panel(annotation, big, "SVG rasterised (svgelements)"),
            ],
            axis=1,
        )
    )

    plan = next(p for p in plan_dataset("seed", 8, seed=2, abnormal_fraction=0.5) if p.abnormal)
    cells = []
    for difficulty in (0.0, 1 / 3, 2 / 3, 1.0):
        slide = render_slide(plan, "seed", None, difficulty)
        cells.append(panel(slide.image, big, f"SEED abnormal, difficulty {difficulty:.2f}", slide.mask))
    rows.append(np.concatenate(cells, axis=1))
    return np.concatenate(rows, axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img/synth_grid.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        grid = build(Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(args.out), grid[:, :, ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 9])
    print(f"wrote {args.out} ({grid.shape[1]}x{grid.shape[0]})")


if __name__ == "__main__":
    main()
