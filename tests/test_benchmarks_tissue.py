"""The gastric-tissue measurement scripts: the regime presets' synth and prepare commands as tissue_probe.py reads
them, the within-group weight table over a grid's cells (amp_groups_grid.py) and two ablation folders side by side
(tables_compare.py), each on hand-made inputs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO


def _script(name: str) -> ModuleType:
    """A benchmark script loaded from its file (a dependency may install another top-level ``benchmarks``)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tissue_probe_reads_every_regime_preset_s_own_commands(tmp_path: Path) -> None:
    probe = _script("tissue_probe")
    for regime in probe.REGIMES:
        synth, prepare = probe.preset_commands(regime)
        assert synth[:2] == ["gastric-fl", "synth"]
        assert prepare[:2] == ["gastric-fl", "prepare"]
        raw = synth[synth.index("--out") + 1]
        assert raw == f"data/raw/{regime}"
        assert prepare[prepare.index("--input") + 1] == raw  # the continuation lines are joined, none is lost
        assert prepare[prepare.index("--out") + 1] == f"data/prepared/{regime}"
    synth, prepare = probe.preset_commands("seed_like")
    assert prepare[-6:] == ["--site-strength", "1", "--tile", "128", "--seed", "0"]
    moved = probe._retarget(synth, tmp_path, "classic")
    assert moved[moved.index("--out") + 1] == str(tmp_path / "classic" / "data_raw_seed_like")
    assert moved[-5:] == ["--tissue", "classic", "--overwrite", "--workers", "2"]
    kept = probe._retarget(prepare, None, "gastric")
    assert kept[kept.index("--out") + 1] == str(REPO / "data" / "prepared" / "seed_like")


def _cell(folder: Path, xis: list[list[list[float]]], finished: bool = True) -> None:
    folder.mkdir(parents=True)
    lines = [json.dumps({"round": r + 1, "xi": xi}) for r, xi in enumerate(xis)]
    (folder / "aggregation.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if finished:
        (folder / "summary.json").write_text("{}", encoding="utf-8")


def test_amp_groups_grid_averages_the_within_group_share_over_seeds(tmp_path: Path) -> None:
    """Four hospitals in groups A, A, B, B (chance 1/3). Seed 0: every hospital puts 0.3 on its group partner and
    0.1 on each other (share 0.6) in round 1, 0.2 / 0.2 (share 1/3) in round 2; seed 1: 0.4 / 0.05 (0.8) in both
    rounds. A run without a summary (cut short) and a cell of another method are left out."""

    def xi(own: float, other: float) -> list[list[float]]:
        partner = {0: 1, 1: 0, 2: 3, 3: 2}
        return [
            [1 - own - 2 * other if j == i else own if j == partner[i] else other for j in range(4)] for i in range(4)
        ]

    cells = tmp_path / "grid" / "cells"
    _cell(cells / "strategy-fedamp_nhead-0_seed-0", [xi(0.3, 0.1), xi(0.2, 0.2)])
    _cell(cells / "strategy-fedamp_nhead-0_seed-1", [xi(0.4, 0.05), xi(0.4, 0.05)])
    _cell(cells / "strategy-fedamp_nhead-0_seed-2", [xi(0.1, 0.3)], finished=False)
    _cell(cells / "strategy-fedavg_seed-0", [xi(0.3, 0.1)])
    out = tmp_path / "amp"
    assert _script("amp_groups_grid").main([str(tmp_path / "grid"), "--groups", "A,A,B,B", "--out", str(out)]) == 0
    record = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert list(record) == ["strategy-fedamp_nhead-0"]
    seeds = record["strategy-fedamp_nhead-0"]
    assert sorted(seeds) == ["0", "1"]
    assert seeds["0"]["first"] == pytest.approx(0.6)
    assert seeds["0"]["last"] == pytest.approx(1 / 3)
    assert seeds["1"]["mean"] == pytest.approx(0.8)
    assert seeds["1"]["chance"] == pytest.approx(1 / 3)
    row = next(line for line in out.with_suffix(".md").read_text(encoding="utf-8").splitlines() if "fedamp" in line)
    # last round over seeds: (1/3 + 0.8) / 2 = 0.567; all rounds: ((0.6 + 1/3) / 2 + 0.8) / 2 = 0.633
    assert row.startswith("| strategy-fedamp_nhead-0 | 2 | 0.700 | 0.567 | 0.633 | 0.333 | +0.233 [")


def test_tables_compare_matches_rows_by_their_settings(tmp_path: Path) -> None:
    head = "strategy,nhead,seeds,avg_test_acc_mean,avg_test_acc_std,avg_test_auc_mean,avg_test_auc_std\n"
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "table6_nhead.csv").write_text(
        head + "fedsaf,3,3,0.8,0.1,0.9,0.05\nfedsaf,6,3,0.7,0.0,0.8,0.0\n", encoding="utf-8"
    )
    (tmp_path / "new" / "table6_nhead.csv").write_text(
        head + "fedsaf,6,5,0.55,0.04,0.56,0.02\nfedsaf,12,5,0.5,0.01,0.5,0.03\n", encoding="utf-8"
    )
    text = _script("tables_compare").compare(tmp_path / "old", tmp_path / "new", ("a", "b"))
    rows = [line for line in text.splitlines() if line.startswith("| strategy=")]
    assert rows == [
        "| strategy=fedsaf, nhead=3 | 3 / 0 | 0.800 ± 0.100 | 0.900 ± 0.050 | - | - |",
        "| strategy=fedsaf, nhead=6 | 3 / 5 | 0.700 ± 0.000 | 0.800 ± 0.000 | 0.550 ± 0.040 | 0.560 ± 0.020 |",
        "| strategy=fedsaf, nhead=12 | 0 / 5 | - | - | 0.500 ± 0.010 | 0.500 ± 0.030 |",
    ]
    assert _script("tables_compare").main([str(tmp_path / "old"), str(tmp_path)]) == 2  # no tables there
