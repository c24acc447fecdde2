"""The gastric-tissue measurement scripts: the regime presets' synth and prepare commands as tissue_probe.py reads
them, the within-group weight table over a grid's cells (amp_groups_grid.py) and two ablation folders side by side
(tables_compare.py), each on hand-made inputs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO

from federation.ablation import CELLS_ARCHIVE, pack_folder


def _script(name: str) -> ModuleType:
    """A benchmark script loaded from its file (a dependency may install another top-level ``benchmarks``)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass of the script looks its module up by name
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


def test_tissue_probe_shows_each_hospitals_case_mix_behind_a_pooled_figure(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    tissue_probe = _script("tissue_probe")
    rows = ["client,split,label,path"]
    # hospital 0: two normal tiles (grey 200, 210) and one abnormal (100); hospital 1: one abnormal tile (50);
    # a validation tile (0) that the train split must not count
    for k, (client, split, label, grey) in enumerate(
        [
            (0, "train", "normal", 200),
            (0, "train", "normal", 210),
            (0, "train", "abnormal", 100),
            (1, "train", "abnormal", 50),
            (0, "val", "normal", 0),
        ]
    ):
        name = f"t{k}.png"
        cv2.imwrite(str(tmp_path / name), np.full((4, 4, 3), grey, np.uint8))
        rows.append(f"{client},{split},{label},{name}")
    (tmp_path / "manifest.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    mix = tissue_probe.hospital_mix(tmp_path, "mean_intensity", "train", 220)
    assert mix == [
        {
            "hospital": 0,
            "tiles": 3,
            "abnormal_share": 0.333,
            "mean_normal": 205.0,
            "mean_abnormal": 100.0,
            "auc_within": 1.0,
        },
        {
            "hospital": 1,
            "tiles": 1,
            "abnormal_share": 1.0,
            "mean_normal": None,
            "mean_abnormal": 50.0,
            "auc_within": None,
        },
    ]
    page = tissue_probe.markdown(
        {
            "r": {
                "gastric": {
                    "seconds": 1.0,
                    "hospital_mix": mix,
                    "probe": {
                        "statistics": {"mean_intensity": "x"},
                        "worst": {"statistic": "mean_intensity", "auc": 0.9, "split": "train"},
                        "worst_within": None,
                        "splits": {"train": {"tiles": 4, "mean_intensity": 0.9}},
                        "within_hospitals": {"train": {"tiles": 4, "mean_intensity": 1.0}},
                    },
                }
            }
        }
    )
    assert "| 0 | 3 | 0.333 | 205 | 100 | 1 |" in page
    assert "| 1 | 1 | 1.000 | n/a | 50 | n/a |" in page


def test_tissue_probe_shows_the_chance_test_of_the_worst_within_split() -> None:
    tissue_probe = _script("tissue_probe")
    chance = {"slides": 13, "shuffles": 999, "worst_within": 0.78, "chance_95": 0.745, "p_value": 0.012}
    probe = {
        "statistics": {"mean_blue": "x"},
        "worst": {"statistic": "mean_blue", "auc": 0.79, "split": "val"},
        "worst_within": {"statistic": "mean_blue", "auc": 0.78, "split": "val"},
        "splits": {"val": {"tiles": 4, "mean_blue": 0.79}},
        "within_hospitals": {"val": {"tiles": 4, "mean_blue": 0.78}},
        "chance": {"train": None, "val": chance},
    }
    page = tissue_probe.markdown({"r": {"gastric": {"seconds": 60.0, "hospital_mix": None, "probe": probe}}})
    assert (
        "| r | n/a | n/a | mean_blue **0.790** (val) | mean_blue **0.780** (val) | 0.745 (13 slides), p = 0.012 | 1.0 |"
        in page
    )
    older = {k: v for k, v in probe.items() if k != "chance"}  # a record made before the chance test
    assert "| n/a | 1.0 |" in tissue_probe.markdown({"r": {"gastric": {"seconds": 60.0, "probe": older}}})


def _finished_cells(cells: Path, values: dict[str, dict[int, tuple[float, float]]]) -> None:
    """A finished cell ``<setting>_seed-<seed>`` per value, whose summary's final figures are (accuracy, AUC)."""
    for setting, seeds in values.items():
        for seed, (acc, auc) in seeds.items():
            cell = cells / f"{setting}_seed-{seed}"
            cell.mkdir(parents=True)
            final = {"avg_test_acc": acc, "avg_test_auc": auc}
            summary = {"status": "finished", "final": final}
            (cell / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


def test_paired_settings_pairs_each_setting_with_the_reference_by_seed(tmp_path: Path) -> None:
    paired_settings = _script("paired_settings")
    cells = tmp_path / "grid" / "cells"
    values = {  # setting: {seed: (accuracy, AUC)}
        "strategy-fedsaf_fim-on_split-on": {0: (0.80, 0.50), 1: (0.70, 0.60), 2: (0.90, 0.55)},
        "strategy-fedsaf_nhead-3": {0: (0.85, 0.50), 1: (0.80, 0.70), 2: (0.95, 0.55), 3: (0.10, 0.10)},
        "strategy-fedavg": {0: (0.10, 0.10)},
    }
    _finished_cells(cells, values)
    (cells / "strategy-fedsaf_nhead-9_seed-0").mkdir()  # a run cut short: no summary, not counted
    # still training: its summary holds its latest round; counted, it would pair with nhead-3's seed 3
    running = cells / "strategy-fedsaf_fim-on_split-on_seed-3"
    running.mkdir()
    partial = {"status": "running", "final": {"avg_test_acc": 0.99, "avg_test_auc": 0.99}}
    (running / "summary.json").write_text(json.dumps(partial), encoding="utf-8")
    out = tmp_path / "paired.md"
    argv = [str(tmp_path / "grid"), "--reference", "strategy-fedsaf_fim-on_split-on", "--out", str(out)]
    assert paired_settings.main(argv) == 0
    page = out.read_text(encoding="utf-8")
    # accuracy differences 0.05, 0.10, 0.05 (seed 3 has no reference): mean 0.0667, sd 0.0289, t(2) 4.303 ->
    # half-width 0.0717; MDD (4.303 + 1.061) * 0.0289 / sqrt(3) = 0.0894. AUC differences 0, 0.1, 0: mean 0.0333, sd
    # 0.0577, half-width 0.1434, MDD 0.179.
    row = "| strategy-fedsaf_nhead-3 | 3 | +0.067 [-0.005, +0.138] (MDD 0.089) | +0.033 [-0.110, +0.177] (MDD 0.179) |"
    assert row in page
    assert "fedavg" not in page
    assert "nhead-9" not in page
    assert paired_settings.main([str(tmp_path / "grid"), "--reference", "strategy-fedsaf_absent"]) == 2


def test_paired_settings_reads_the_reference_from_another_grid(tmp_path: Path) -> None:
    """Separate on a flattened copy of the tiles (seeds 0, 1, 3) against Separate on the raw tiles (seeds 0-2) of
    another grid: the namesake is a row, paired over seeds 0 and 1 only; the raw grid's other method is not."""
    paired_settings = _script("paired_settings")
    raw = {"strategy-separate": {0: (0.80, 0.90), 1: (0.70, 0.80), 2: (0.60, 0.70)}, "strategy-fedavg": {0: (0.1, 0.1)}}
    _finished_cells(tmp_path / "raw" / "cells", raw)
    _finished_cells(
        tmp_path / "flat" / "cells", {"strategy-separate": {0: (0.75, 0.80), 1: (0.70, 0.75), 3: (0.5, 0.5)}}
    )
    out = tmp_path / "flat.md"
    argv = [str(tmp_path / "flat"), "--method", "strategy-separate", "--reference", "strategy-separate"]
    argv += ["--reference-grid", str(tmp_path / "raw"), "--out", str(out)]
    assert paired_settings.main(argv) == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("# Paired differences to strategy-separate of another grid")
    # accuracy -0.05, 0.00: mean -0.025, sd 0.0354, t(1) 12.706 -> [-0.343, +0.293]; MDD (12.706 + 1.376) * 0.025
    # = 0.352. AUC -0.10, -0.05: mean -0.075 -> [-0.393, +0.243], MDD 0.352.
    row = "| strategy-separate | 2 | -0.025 [-0.343, +0.293] (MDD 0.352) | -0.075 [-0.393, +0.243] (MDD 0.352) |"
    assert row in page
    assert "fedavg" not in page
    absent = [*argv[:4], "strategy-fedprox", "--reference-grid", str(tmp_path / "raw")]
    assert paired_settings.main(absent) == 2


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


def _fmnist_cell(folder: Path, method: str, seed: int, rounds: list[list[tuple[float, int]]], status: str) -> None:
    """A cell with ``rounds[r]`` = each hospital's (test_acc, num_test) in round r + 1."""
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(f'[run]\nseed = {seed}\n\n[strategy]\nname = "{method}"\n', encoding="utf-8")
    lines = [
        json.dumps({"round": r + 1, "client": c, "test_acc": acc, "num_test": n})
        for r, hospitals in enumerate(rounds)
        for c, (acc, n) in enumerate(hospitals)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps({"status": status}), encoding="utf-8")


def test_table7_paper_pools_like_pfllib_and_pairs_fedsaf_by_seed(tmp_path: Path) -> None:
    """Two hospitals of 30 and 10 test images. Pooled accuracy is PFLlib's (correct over all test images), the best
    round picked over rounds; mean accuracy counts each hospital once. A run that did not finish is left out."""
    t7 = _script("table7_paper")
    cells = tmp_path / "grid" / "cells"
    # fedsaf seed 0: round 1 pooled (0.5*30 + 0.9*10)/40 = 0.6, round 2 (0.8*30 + 0.2*10)/40 = 0.65 (mean 0.5)
    _fmnist_cell(cells / "a", "fedsaf", 0, [[(0.5, 30), (0.9, 10)], [(0.8, 30), (0.2, 10)]], "finished")
    _fmnist_cell(cells / "b", "fedsaf", 1, [[(0.7, 30), (0.7, 10)], [(0.6, 30), (1.0, 10)]], "finished")
    _fmnist_cell(cells / "c", "fedavg", 0, [[(0.4, 30), (0.4, 10)], [(0.5, 30), (0.5, 10)]], "finished")
    _fmnist_cell(cells / "d", "fedavg", 1, [[(0.3, 30), (0.3, 10)], [(0.6, 30), (0.2, 10)]], "finished")
    _fmnist_cell(cells / "e", "fedavg", 2, [[(0.9, 30), (0.9, 10)]], "stopped")
    runs = t7.collect(tmp_path / "grid")
    assert [(r.method, r.seed) for r in runs] == [("fedavg", 0), ("fedavg", 1), ("fedsaf", 0), ("fedsaf", 1)]
    saf0 = runs[2]
    assert (saf0.best_round, saf0.rounds) == (2, 2)
    assert saf0.best_pooled == pytest.approx(0.65)
    assert saf0.last_pooled == pytest.approx(0.65)
    assert saf0.last_mean == pytest.approx(0.5)
    saf1 = runs[3]  # round 1 pooled 0.7, round 2 (18 + 10)/40 = 0.7: a tie keeps the earlier round
    assert (saf1.best_round, saf1.best_pooled, saf1.last_mean) == (1, pytest.approx(0.7), pytest.approx(0.8))
    avg1 = runs[1]  # round 2 pooled (18 + 2)/40 = 0.5
    assert avg1.best_pooled == pytest.approx(0.5)
    text = t7.table(runs)
    assert "| fedavg | 0.6677 | 2 | 0.5000 ± 0.0000 | 0.5000 ± 0.0000 | 0.4500 ± 0.0707 |" in text
    assert "| fedsaf | 0.9642 | 2 | 0.6750 ± 0.0354 | 0.6750 ± 0.0354 | 0.6500 ± 0.2121 |" in text
    # FedSAF minus FedAvg by seed: best pooled 0.15 and 0.2 (mean 0.175); last mean 0.0 and 0.4 (mean 0.2)
    row = next(line for line in text.splitlines() if line.startswith("| fedavg | 2 |"))
    assert row.split(" | ")[2].startswith("+0.175 [")
    assert row.split(" | ")[4].startswith("+0.200 [")
    assert t7.main([str(tmp_path / "none")]) == 2

    # a published folder: the same runs read from its cells.tar.xz alone
    published = tmp_path / "published"
    published.mkdir()
    pack_folder(cells, published / CELLS_ARCHIVE)
    assert t7.collect(published) == runs
    assert not (published / "cells").exists()


def test_table7_data_sets_each_method_s_seed_0_run_beside_its_run_on_more_images(tmp_path: Path) -> None:
    """Three folders (more images in each): per method of the first, the seed-0 run's best pooled accuracy with its
    round and the last round's, "-" where a folder lacks the method, and the change from the first folder to each
    other; other seeds are left out."""
    data = _script("table7_data")
    small, mid, large = (tmp_path / name / "cells" for name in ("small", "mid", "large"))
    # fedsaf small: pooled (0.5*30 + 0.9*10)/40 = 0.6 then (0.8*30 + 0.2*10)/40 = 0.65
    _fmnist_cell(small / "a", "fedsaf", 0, [[(0.5, 30), (0.9, 10)], [(0.8, 30), (0.2, 10)]], "finished")
    _fmnist_cell(small / "b", "fedsaf", 1, [[(0.1, 30), (0.1, 10)]], "finished")
    _fmnist_cell(small / "c", "fedavg", 0, [[(0.4, 30), (0.4, 10)]], "finished")
    # fedsaf mid: pooled (0.9*60 + 0.5*20)/80 = 0.8 then (0.7*60 + 0.7*20)/80 = 0.7; fedavg mid 0.5
    _fmnist_cell(mid / "a", "fedsaf", 0, [[(0.9, 60), (0.5, 20)], [(0.7, 60), (0.7, 20)]], "finished")
    _fmnist_cell(mid / "c", "fedavg", 0, [[(0.5, 60), (0.5, 20)]], "finished")
    _fmnist_cell(large / "a", "fedsaf", 0, [[(0.6, 60), (0.6, 20)]], "finished")
    columns = [
        (label, data.seed0(data.collect(cells.parent))) for label, cells in (("40", small), ("80", mid), ("90", large))
    ]
    lines = data.data_table(columns)
    assert lines[0] == (
        "| method | paper | 40: best pooled (round) / last pooled | 80: best pooled (round) / last pooled "
        "| 90: best pooled (round) / last pooled | change 40 -> 80: best / last | change 40 -> 90: best / last |"
    )
    assert lines[2:] == [
        "| fedavg | 0.6677 | 0.400 (1) / 0.400 | 0.500 (1) / 0.500 | - | +0.100 / +0.100 | - |",
        "| fedsaf | 0.9642 | 0.650 (2) / 0.650 | 0.800 (1) / 0.700 | 0.600 (1) / 0.600 "
        "| +0.150 / +0.050 | -0.050 / -0.050 |",
    ]
    assert data.main([f"{small.parent}=40"]) == 2  # one folder: nothing to compare
    assert data.main([f"{small.parent}=40", f"{tmp_path / 'none'}=80"]) == 2
    assert data.main([str(small.parent), f"{mid.parent}=80"]) == 2  # no label
    out = tmp_path / "data.md"
    assert data.main([f"{small.parent}=40", f"{mid.parent}=80", "--out", str(out)]) == 0
    assert "| fedsaf | 0.9642 | 0.650 (2) / 0.650 | 0.800 (1) / 0.700 | +0.150 / +0.050 |" in out.read_text("utf-8")


def _auc_cell(folder: Path, rounds: list[list[tuple[float, float]]], status: str = "finished") -> None:
    """A cell with ``rounds[r]`` = each hospital's (test_auc, test_acc) in round r + 1."""
    folder.mkdir(parents=True)
    lines = [
        json.dumps({"round": r + 1, "client": c, "test_auc": auc, "test_acc": acc, "num_test": 10})
        for r, hospitals in enumerate(rounds)
        for c, (auc, acc) in enumerate(hospitals)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps({"status": status}), encoding="utf-8")


def test_hospital_paired_takes_each_hospital_s_last_round_and_pairs_it_by_seed(tmp_path: Path) -> None:
    """Two settings, two hospitals, two seeds: the last round's figures per hospital (the first round is ignored),
    mean ± sd over seeds, and setting minus reference per hospital paired by seed; an unfinished cell is left out."""
    hp = _script("hospital_paired")
    cells = tmp_path / "grid" / "cells"
    _auc_cell(cells / "strategy-separate_rounds-2_seed-0", [[(0.1, 0.1), (0.1, 0.1)], [(0.8, 0.7), (0.6, 0.5)]])
    _auc_cell(cells / "strategy-separate_rounds-2_seed-1", [[(0.1, 0.1), (0.1, 0.1)], [(0.9, 0.8), (0.7, 0.6)]])
    _auc_cell(cells / "strategy-fedsaf_rounds-2_seed-0", [[(0.9, 0.9), (0.9, 0.9)], [(0.7, 0.6), (0.6, 0.5)]])
    _auc_cell(cells / "strategy-fedsaf_rounds-2_seed-1", [[(0.9, 0.9), (0.9, 0.9)], [(0.7, 0.7), (0.8, 0.6)]])
    _auc_cell(cells / "strategy-fedsaf_rounds-2_seed-2", [[(0.1, 0.1), (0.1, 0.1)]], status="running")
    figures = hp.collect(tmp_path / "grid")
    assert sorted(figures) == ["strategy-fedsaf_rounds-2", "strategy-separate_rounds-2"]
    assert figures["strategy-fedsaf_rounds-2"][1] == {
        0: {"test_auc": 0.6, "test_acc": 0.5},
        1: {"test_auc": 0.8, "test_acc": 0.6},
    }
    lines = hp.tables(figures, "strategy-separate")
    # separate hospital 0 AUC 0.8, 0.9: mean 0.85, sd 0.0707; fedsaf hospital 1 AUC 0.6, 0.8: mean 0.7, sd 0.1414
    assert "| strategy-separate_rounds-2 | 2 | 0.850 ± 0.071 | 0.650 ± 0.071 |" in lines
    assert "| strategy-fedsaf_rounds-2 | 2 | 0.700 ± 0.000 | 0.700 ± 0.141 |" in lines
    # AUC differences: hospital 0 -0.1 and -0.2 (mean -0.15, sd 0.0707: t 12.706 gives +-0.635 and the MDD is
    # (12.706 + 1.376) * 0.05); hospital 1 0.0 and +0.1
    row = next(line for line in lines if line.startswith("| strategy-fedsaf_rounds-2 | -0.150 ["))
    assert row.split(" | ")[1] == "-0.150 [-0.785, +0.485] (MDD 0.704)"
    assert row.split(" | ")[2].startswith("+0.050 [")
    assert hp.main([str(tmp_path / "grid"), "--reference", "strategy-fedavg"]) == 2
    assert hp.main([str(tmp_path / "none")]) == 2
