"""The shortcut probe (`pipeline.probe`): exact statistics by hand, a planted shortcut found, none where none is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.probe import STATISTICS, WARN_AUC, probe, separation_auc, tile_statistics


def test_tile_statistics_by_hand() -> None:
    tile = np.array([[[255, 255, 255], [230, 240, 221]], [[10, 20, 30], [255, 255, 254]]], dtype=np.uint8)
    pure, near, mean, red, green, blue = tile_statistics(tile, 220)
    assert pure == 0.25  # only the first pixel has every channel at 255
    assert near == 0.75  # (230, 240, 221) and (255, 255, 254) are near-white too
    assert mean == pytest.approx(tile.mean())
    assert (red, green, blue) == (pytest.approx(187.5), pytest.approx(192.5), pytest.approx(190.0))
    gray = np.array([[255, 100], [100, 100]], dtype=np.uint8)
    assert tile_statistics(gray, 220) == (0.25, 0.25, 138.75, 138.75, 138.75, 138.75)


def test_separation_auc_is_oriented_and_undefined_for_one_class() -> None:
    assert separation_auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert separation_auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 1.0  # usable in either direction
    # One of the four (normal, abnormal) pairs is misordered: AUC 3/4.
    assert separation_auc([0.1, 0.6, 0.5, 0.9], [0, 0, 1, 1]) == 0.75
    assert separation_auc([0.1, 0.2], [1, 1]) is None


def _tiles(rng: np.random.Generator, n: int, painted: float) -> list[np.ndarray]:
    """Tissue-like noise tiles; ``painted``: share of tiles with a pure-white corner painted in (the shortcut)."""
    out = []
    for k in range(n):
        tile = rng.integers(120, 200, size=(16, 16, 3), dtype=np.uint8)
        if k < painted * n:
            tile[:6, :6] = 255
        out.append(tile)
    return out


def _record(normal: list[np.ndarray], abnormal: list[np.ndarray]) -> dict:  # type: ignore[type-arg]
    tiles = normal + abnormal
    labels = [0] * len(normal) + [1] * len(abnormal)
    splits = ["test"] * len(tiles)
    clients = [k % 2 for k in range(len(tiles))]
    return probe([tile_statistics(t, 220) for t in tiles], labels, splits, clients, ("train", "test"))


def test_a_planted_shortcut_is_found_and_warned_about() -> None:
    rng = np.random.default_rng(0)
    record = _record(_tiles(rng, 60, 0.0), _tiles(rng, 60, 0.95))
    test = record["splits"]["test"]
    assert test["pure_white"] > 0.95
    assert test["near_white"] > 0.95
    assert record["worst"]["split"] == "test"
    assert record["worst"]["auc"] > WARN_AUC
    assert record["warning"] is not None
    assert "test tiles at AUC" in record["warning"]
    assert record["splits"]["train"] == {"tiles": 0, **dict.fromkeys(STATISTICS)}  # no train tiles: undefined
    assert set(record["clients"]) == {"0", "1"}
    json.dumps(record)  # JSON-ready for prepare.json


def test_no_shortcut_reads_near_one_half_and_does_not_warn() -> None:
    rng = np.random.default_rng(1)
    record = _record(_tiles(rng, 200, 0.5), _tiles(rng, 200, 0.5))
    for name in STATISTICS:
        assert 0.5 <= record["splits"]["test"][name] < 0.6, name
    assert record["warning"] is None


def test_prepare_records_the_probe_and_warns_on_a_masked_dataset(tmp_path: Path) -> None:
    from pipeline.config import build_config
    from pipeline.prepare import prepare_dataset
    from pipeline.synth import generate_dataset

    raw = tmp_path / "raw"
    generate_dataset(raw, "seed", images=12, seed=4, size=256)

    def run(out: Path, masked: bool) -> dict:  # type: ignore[type-arg]
        config = build_config(
            None,
            {
                "source": {"format": "seed", "input": raw},
                "split": {"clients": 2, "sizes": "equal"},
                "tiles": {"tile": 64, "mask_outside": masked},
                "output": {"out": out},
            },
        )
        result = prepare_dataset(config)
        record = json.loads((out / "prepare.json").read_text())
        assert record["shortcut_probe"]["warning"] == result.shortcut_warning
        assert "## Shortcut probe" in (out / "report.md").read_text()
        return record["shortcut_probe"]  # type: ignore[no-any-return]

    masked = run(tmp_path / "masked", True)
    raw_probe = run(tmp_path / "raw_tiles", False)
    # Step a.1 paints white into the abnormal training tiles: the pure-white share then separates train almost
    # perfectly, while the raw test tiles (never masked) and the raw dataset show no such separation.
    assert masked["splits"]["train"]["pure_white"] > 0.9
    assert masked["warning"] is not None
    assert raw_probe["splits"]["train"]["pure_white"] < 0.7
    assert masked["splits"]["test"]["pure_white"] == raw_probe["splits"]["test"]["pure_white"]


def test_a_mask_outside_dataset_is_named_wherever_its_results_carry_the_intended_use(tmp_path: Path) -> None:
    from infra.provenance import INTENDED_USE, MASKED_NOTE, intended_use

    dataset = tmp_path / "prepared"
    dataset.mkdir()
    (dataset / "prepare.json").write_text(json.dumps({"synthetic": False, "labels": {"departure": None}}))
    assert intended_use(dataset) == INTENDED_USE
    (dataset / "prepare.json").write_text(json.dumps({"synthetic": False, "labels": {"departure": "whitened"}}))
    assert intended_use(dataset) == f"{INTENDED_USE} {MASKED_NOTE}"
