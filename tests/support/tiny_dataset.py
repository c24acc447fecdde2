"""A tiny prepared dataset (``data/README.md`` section 2) for engine tests: three unequal hospitals.

* client 0: RGB, 10 train (5 normal / 5 abnormal), 4 test (2 / 2)
* client 1: RGB, 7 train (3 / 4), 3 test, all abnormal: a single-class test split (AUC undefined)
* client 2: grayscale (``channels = 1``), 5 train (3 / 2), 4 test (2 / 2)

Tiles are 40x40 PNGs of noise around a class-dependent colour, so a model can learn something in a few steps.
"""

from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np

COLUMNS = ("client", "split", "label", "path", "source", "x", "y", "size", "white_ratio", "channels")
# client -> split -> (normal, abnormal) counts
LAYOUT: dict[int, dict[str, tuple[int, int]]] = {
    0: {"train": (5, 5), "test": (2, 2)},
    1: {"train": (3, 4), "test": (0, 3)},
    2: {"train": (3, 2), "test": (2, 2)},
}
GRAY_CLIENTS = frozenset({2})
TILE = 40


def make_dataset(root: Path, seed: int = 0) -> Path:
    """Write the dataset under ``root`` and return its folder."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for client, splits in LAYOUT.items():
        gray = client in GRAY_CLIENTS
        for split, counts in splits.items():
            for label_index, (label, count) in enumerate(zip(("normal", "abnormal"), counts, strict=True)):
                base = np.array([200, 120, 180] if label_index == 0 else [120, 40, 140], dtype=np.float64)
                for i in range(count):
                    tile = np.clip(base + rng.normal(0, 30, (TILE, TILE, 3)), 0, 255).astype(np.uint8)
                    rel = f"client_{client:02d}/{split}/{label}/c{client}_{split}_{label}_{i}.png"
                    path = root / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    if gray:
                        cv2.imwrite(str(path), cv2.cvtColor(tile, cv2.COLOR_RGB2GRAY))
                    else:
                        cv2.imwrite(str(path), cv2.cvtColor(tile, cv2.COLOR_RGB2BGR))
                    rows.append(
                        {
                            "client": client,
                            "split": split,
                            "label": label,
                            "path": rel,
                            "source": f"slide_{client}_{split}_{i}.png",
                            "x": 0,
                            "y": 0,
                            "size": TILE,
                            "white_ratio": 0.0,
                            "channels": 1 if gray else 3,
                        }
                    )
    with (root / "manifest.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return root


TINY_SETTINGS: tuple[str, ...] = (
    "run.rounds=2",
    "data.input_size=32",
    "data.batch_size=4",
    "data.eval_batch_size=8",
    "client.lr=0.01",
)


def name_tiles_by_slide(folder: Path) -> Path:
    """``folder`` (a `make_dataset` dataset) with prepare's tile names, two tiles per slide
    (``<slide>_s<slide>_x.._y...png``), which slide-level DP and slide scoring need; returns ``folder``."""
    manifest = folder / "manifest.csv"
    with manifest.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for i, row in enumerate(rows):
        old = folder / row["path"]
        new_name = f"{i // 2:05d}_s{i // 2}_x{(i % 2) * 40:05d}_y00000.png"
        row["path"] = str(Path(row["path"]).with_name(new_name).as_posix())
        old.rename(folder / row["path"])
    with manifest.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return folder
