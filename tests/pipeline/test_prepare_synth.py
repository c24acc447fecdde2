"""`prepare` on the synthetic generator's SEED and BOT output (small slides), checked against the generator's truth."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.checks import every
from support.images import file_hashes

from pipeline.config import PrepareConfig, build_config
from pipeline.prepare import prepare_dataset
from pipeline.svgmask import rasterise_svg
from pipeline.synth import generate_dataset


def _imread(path: Path, flags: int = cv2.IMREAD_COLOR) -> np.ndarray:
    image = cv2.imread(str(path), flags)
    assert image is not None, path
    return np.asarray(image)


def _manifest(out: Path) -> list[dict[str, str]]:
    with (out / "manifest.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def seed_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = tmp_path_factory.mktemp("synth") / "seed"
    generate_dataset(raw, "seed", images=12, seed=4, size=256)
    return raw


@pytest.fixture(scope="module")
def bot_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = tmp_path_factory.mktemp("synth") / "bot"
    generate_dataset(raw, "bot", images=8, seed=2, size=256, abnormal_fraction=0.5)
    return raw


def _config(raw: Path, out: Path, fmt: str, **split: object) -> PrepareConfig:
    return build_config(
        None,
        {
            "source": {"format": fmt, "input": raw},
            "split": {"clients": 2, "sizes": "equal", **split},
            "tiles": {"tile": 64, "background_max": 0.4, "abnormal_coverage": 0.6},
            "clients": {"grayscale": [1]},
            "output": {"out": out},
        },
    )


def test_seed_synth_labels_white_ratios_and_splits(seed_raw: Path, tmp_path: Path) -> None:
    before = file_hashes(seed_raw)
    out = tmp_path / "prepared"
    result = prepare_dataset(_config(seed_raw, out, "seed"))
    assert not result.skipped
    truth = {f"{s['id']}.png": s["label"] for s in json.loads((seed_raw / "synth.json").read_text())["slides"]}
    rows = _manifest(out)
    assert {r["source"] for r in rows} <= set(truth)
    split_of: dict[str, set[str]] = {}
    for row in rows:
        assert row["label"] == truth[row["source"]]
        mask = _imread(seed_raw / row["source"].replace(".png", "_mask.png"), cv2.IMREAD_GRAYSCALE)
        assert (row["label"] == "abnormal") == bool(mask.any())
        tile = _imread(out / row["path"], cv2.IMREAD_UNCHANGED)
        assert tile.ndim == (2 if row["client"] == "1" else 3)
        assert float(row["white_ratio"]) <= 0.4  # one raw white filter for both classes
        if tile.ndim == 3:
            assert float((tile.min(axis=2) >= 220).mean()) == pytest.approx(float(row["white_ratio"]), abs=1e-6)
        split_of.setdefault(row["source"], set()).add(row["split"])
    assert every(len(s) == 1 for s in split_of.values())
    assert {r["label"] for r in rows} == {"normal", "abnormal"}
    assert file_hashes(seed_raw) == before


def test_bot_synth_tiles_come_from_inside_the_annotation(bot_raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "prepared"
    result = prepare_dataset(_config(bot_raw, out, "bot"))
    assert not result.skipped
    rows = _manifest(out)
    assert {r["label"] for r in rows} == {"normal", "abnormal"}
    abnormal = [r for r in rows if r["label"] == "abnormal" and r["client"] == "0"]
    assert abnormal
    for row in abnormal:
        assert row["source"].startswith("abnormal/")
        svg = (bot_raw / row["source"]).with_suffix(".svg").read_bytes()
        mask = rasterise_svg(svg, 256, 256, "a.svg").mask > 0
        x, y, size = int(row["x"]), int(row["y"]), int(row["size"])
        inside = mask[y : y + size, x : x + size]
        tile = _imread(out / row["path"])
        tissue = tile.min(axis=2) < 220
        # At least 60 % of the tile's tissue lies inside the annotated region, and the tile is raw.
        assert (tissue & inside).sum() >= 0.6 * tissue.sum()
        slide = _imread(bot_raw / row["source"])
        assert np.array_equal(tile, slide[y : y + size, x : x + size])
    assert every(r["source"].startswith("normal/") for r in rows if r["label"] == "normal")


def test_synth_rerun_gives_identical_bytes(seed_raw: Path, tmp_path: Path) -> None:
    prepare_dataset(_config(seed_raw, tmp_path / "a", "seed", partition="dirichlet:1", sizes="random"))
    prepare_dataset(_config(seed_raw, tmp_path / "b", "seed", partition="dirichlet:1", sizes="random"))
    first, second = file_hashes(tmp_path / "a"), file_hashes(tmp_path / "b")
    assert first == second
    assert len(first) > 10
    sheet = _imread(tmp_path / "a" / "contact_sheet.png")
    assert sheet is not None
    assert np.asarray(sheet).std() > 10
