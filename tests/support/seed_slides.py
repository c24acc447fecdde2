"""Tiny hand-built raw slides for the `prepare` tests: SEED (PNG slide + mask) and BOT (TIFF + outline SVG) layouts
of 96x96 slides with a known white strip and known cancer masks, a config for them and the manifest they give."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

import cv2
import numpy as np
import tifffile

from pipeline.config import PrepareConfig, build_config

SIZE = 96
TILE = 32
STRIP = 20  # white columns on the left of every slide


def tissue(rng: np.random.Generator) -> np.ndarray:
    """Pink-purple noise (min channel < 220 everywhere) with a white strip of STRIP columns on the left."""
    base = np.array([200, 110, 170], dtype=np.int16)
    image = (base + rng.integers(-25, 25, size=(SIZE, SIZE, 3))).clip(0, 255).astype(np.uint8)
    image[:, :STRIP] = 250
    return image


def cancer_mask(k: int) -> np.ndarray:
    """A cancer rectangle whose position depends on k (so tiles differ between slides)."""
    mask = np.zeros((SIZE, SIZE), dtype=np.uint8)
    top = 8 * (k % 3)
    mask[top : top + 70, 30:90] = 255
    return mask


def make_seed(root: Path, n: int = 12, seed: int = 0) -> dict[str, str]:
    """SEED layout: slides s00.png.. with s00_mask.png; every other slide abnormal. Returns source -> label."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    truth = {}
    for k in range(n):
        image = tissue(rng)
        mask = cancer_mask(k) if k % 2 else np.zeros((SIZE, SIZE), np.uint8)
        cv2.imwrite(str(root / f"s{k:02d}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
        cv2.imwrite(str(root / f"s{k:02d}_mask.png"), mask)
        truth[f"s{k:02d}.png"] = "abnormal" if k % 2 else "normal"
    (root / "notes.json").write_text("{}")  # non-image files are ignored
    return truth


def outline_svg(points: str, transform: str = "") -> str:
    """A SIZE x SIZE SVG holding one unfilled polygon through ``points``, in a group with ``transform`` if given."""
    group = f'<g transform="{transform}">' if transform else "<g>"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{SIZE}" height="{SIZE}" viewBox="0 0 {SIZE} {SIZE}">'
        f'{group}<polygon points="{points}" fill="none" stroke="green"/></g></svg>'
    )


def make_bot(root: Path, normal: int = 4, abnormal: int = 6) -> None:
    """BOT layout: TIFF slides in normal/ and abnormal/, an outline-only SVG (with a transform) per abnormal one."""
    rng = np.random.default_rng(1)
    for label, count in (("normal", normal), ("abnormal", abnormal)):
        (root / label).mkdir(parents=True, exist_ok=True)
        for k in range(count):
            tifffile.imwrite(root / label / f"b{k:02d}.tiff", tissue(rng), photometric="rgb")
            if label == "abnormal":
                (root / label / f"b{k:02d}.svg").write_text(outline_svg("0,0 60,0 60,70 0,70", "translate(30,8)"))


def read_manifest(out: Path) -> list[dict[str, str]]:
    """The rows of ``out / manifest.csv``, in file order."""
    with (out / "manifest.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def config_for(raw: Path, out: Path, fmt: str = "seed", **sections: Mapping[str, object]) -> PrepareConfig:
    """A prepare config for ``raw`` -> ``out``: two equal hospitals, TILE-pixel tiles, two workers; each keyword is
    a section whose values replace or add to those."""
    base: dict[str, dict[str, object]] = {
        "source": {"format": fmt, "input": raw},
        "split": {"clients": 2, "sizes": "equal", "seed": 0},
        "tiles": {"tile": TILE},
        "output": {"out": out, "workers": 2},
    }
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    return build_config(None, base)
