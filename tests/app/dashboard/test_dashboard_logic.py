"""The dashboard's data shaping, without Streamlit: hand-computed figures on unequal hospitals."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.dashboard import Fixture

from app import run_records
from app.dashboard import compare
from app.datasets import counts_table, list_datasets, load_manifest, sample_tiles
from app.errors import DashboardError
from app.evaluation.metrics import confusion, ranked_examples, rates, roc


def _manifest(rows: list[tuple[int, str, str, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"client": c, "split": s, "label": lab, "path": f"t{i}.png", "source": "a.png", "x": 0, "y": 0}
            | {"size": size, "white_ratio": 0.0, "channels": 1 if c == 1 else 3}
            for i, (c, s, lab, size) in enumerate(rows)
        ]
    )


def test_counts_table_on_unequal_hospitals() -> None:
    manifest = _manifest(
        [(0, "train", "normal", 128)] * 3
        + [(0, "train", "abnormal", 128)]
        + [(0, "test", "abnormal", 256)] * 2
        + [(1, "test", "normal", 128)]
    )
    table = counts_table(manifest).set_index("hospital")
    assert table.loc["Hospital 0", ["train normal", "train abnormal", "test normal", "test abnormal"]].tolist() == [
        3,
        1,
        0,
        2,
    ]
    assert table.loc["Hospital 0", "total"] == 6
    assert table.loc["Hospital 1", "total"] == 1
    assert table.loc["Hospital 0", "source px"] == "128, 256"
    assert not table.loc["Hospital 0", "grayscale"]
    assert table.loc["Hospital 1", "grayscale"]


def test_manifest_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "manifest.csv").write_text("client,split\n0,train\n")
    with pytest.raises(DashboardError, match=r"manifest\.csv lacks columns"):
        load_manifest(tmp_path)
    with pytest.raises(DashboardError, match="gastric-fl prepare"):
        load_manifest(tmp_path / "nowhere")


def test_datasets_listed_and_sampled(fixture_root: Fixture) -> None:
    found = list_datasets(fixture_root.root / "prepared")
    assert [d.name for d in found] == ["tiny"]
    manifest = load_manifest(found[0].path)
    sample = sample_tiles(manifest, 2, per_label=1)
    assert sorted(sample["label"]) == ["abnormal", "normal"]
    assert set(sample["client"]) == {2}
    assert stored_px(found[0].path, manifest) == {16}


def stored_px(dataset: Path, manifest: pd.DataFrame) -> set[int]:
    table = counts_table(manifest, dataset)
    return {int(v) for v in table["stored px"]}


def test_per_round_figures_by_hand(fixture_root: Fixture) -> None:
    rounds = run_records.per_round(run_records.load_metrics(fixture_root.finished)).set_index("round")
    # Round 1: acc (0.50, 0.75, 0.25); hospital 2's AUC is null and left out: AUC over (0.625, 0.8125).
    assert rounds.loc[1, "acc_mean"] == pytest.approx(0.5)
    assert rounds.loc[1, "acc_std"] == pytest.approx(math.sqrt((0 + 0.25**2 + 0.25**2) / 3))
    assert rounds.loc[1, "auc_mean"] == pytest.approx(0.71875)
    assert rounds.loc[1, "auc_std"] == pytest.approx(0.09375)
    assert rounds.loc[1, "auc_clients"] == 2
    assert rounds.loc[1, "seconds"] == pytest.approx(6.0)
    # Values: 3 x (1000 + 1000) in round 1, 3 x (900 + 900) in round 2, cumulated.
    assert rounds["values_total"].tolist() == [6000, 11400]


def test_run_figures_are_the_papers(fixture_root: Fixture) -> None:
    table = compare.compare_table([("done", fixture_root.finished), ("broken", fixture_root.failed)])
    row = table.set_index("run").loc["done"]
    assert row["Averaged ACC"] == pytest.approx(0.75)  # last round (0.75, 1.0, 0.5)
    assert row["Std ACC"] == pytest.approx(math.sqrt(0.125 / 3))
    assert row["Best ACC"] == pytest.approx(0.75)
    assert row["Averaged AUC"] == pytest.approx((0.875 + 0.9375 + 0.6875) / 3)
    assert row["Best AUC"] == pytest.approx((0.875 + 0.9375 + 0.6875) / 3)
    assert row["Values transmitted"] == 11400
    assert row["Sent / round"] == pytest.approx((3000 + 2700) / 2)
    # No seconds in summary.json or aggregation.jsonl: the clients' seconds, 6 + 7.5.
    assert row["Seconds"] == pytest.approx(13.5)
    assert (row["algorithm"], row["nhead"], row["dm"], row["status"]) == ("fedsaf", 2, "manhattan", "finished")
    broken = table.set_index("run").loc["broken"]
    assert broken["status"] == "failed"
    assert math.isnan(broken["Averaged ACC"])


def test_latest_per_hospital_matches_metrics(fixture_root: Fixture) -> None:
    table = run_records.latest_per_hospital(run_records.load_metrics(fixture_root.finished))
    assert table["hospital"].tolist() == ["Hospital 0", "Hospital 1", "Hospital 2"]
    assert table["test AUC"].tolist() == [0.875, 0.9375, 0.6875]
    assert table["round"].tolist() == [2, 2, 2]


def test_jsonl_being_written_and_damaged(tmp_path: Path) -> None:
    """A line being appended is left out quietly; a damaged line before the last is left out and named."""
    path = tmp_path / "aggregation.jsonl"
    path.write_text('{"round": 1, "xi": null}\n{"round": 2, "x')
    assert run_records.load_aggregation(tmp_path) == [{"round": 1, "xi": None}]
    assert run_records.run_problem(tmp_path) is None
    path.write_text('{"round": 1}\nnot json\n{"round": 2}\n')
    assert run_records.load_aggregation(tmp_path) == [{"round": 1}, {"round": 2}]
    assert "aggregation.jsonl line 2 is not valid JSON" in (run_records.run_problem(tmp_path) or "")


def test_progress_from_file_times(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[run]\nrounds = 4\n")
    lines = [{"round": r, "client": c, "test_acc": 0.5} for r in (1, 2) for c in (0, 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    os.utime(run / "config.toml", (1000, 1000))
    os.utime(run / "metrics.jsonl", (1100, 1100))
    state = run_records.progress(run, 4, now=1120.0)
    assert state.rounds_done == 2
    assert state.fraction == 0.5
    assert state.seconds_elapsed == 120.0
    assert state.seconds_left == pytest.approx(80.0)  # 50 s per round x 2 rounds, 20 s of round 3 gone


def test_xi_and_grid(fixture_root: Fixture) -> None:
    xi = run_records.xi_matrices(run_records.load_aggregation(fixture_root.finished))
    assert sorted(xi) == [1, 2]
    assert xi[2][0].tolist() == [0.8, 0.15, 0.05]
    (grid,) = compare.list_grids(fixture_root.root / "ablations")
    assert grid.path == fixture_root.grid
    assert grid.varied() == ["nhead", "dm"]
    table = compare.grid_table(grid)
    assert list(table.columns[:4]) == ["run", "nhead", "dm", "seed"]
    heat = compare.grid_heatmap(table, "Best ACC")
    # Best averaged ACC is 0.75 x the fixture's scale 0.5 + 0.1 nhead (+0.05 for euclidean).
    assert heat.loc[0, "manhattan"] == pytest.approx(0.75 * 0.5)
    assert heat.loc[2, "euclidean"] == pytest.approx(0.75 * 0.75)
    one_cell = table[(table["nhead"] == 0) & (table["dm"] == "manhattan")]
    assert compare.grid_heatmap(one_cell, "Best ACC").empty


def test_broken_ablation_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "ablation.json").write_text("{")
    with pytest.raises(DashboardError, match=r"ablation\.json cannot be read"):
        compare.load_grid(tmp_path)


def test_run_list_reads_status_and_dataset(fixture_root: Fixture) -> None:
    listed = {r.run_id: r for r in run_records.list_runs(fixture_root.root / "runs")}
    failed = listed[fixture_root.failed.name]
    assert failed.status == "failed"
    assert failed.error is not None
    assert "CUDA" in failed.error
    finished = listed[fixture_root.finished.name]
    assert (finished.status, finished.algorithm, finished.rounds_total) == ("finished", "fedsaf", 2)
    assert finished.dataset == fixture_root.dataset


def test_roc_confusion_and_ranking_by_hand() -> None:
    labels = np.array([0, 0, 0, 1, 1])
    probs = np.array([0.1, 0.6, 0.3, 0.8, 0.45])
    # 0.8 outranks all three normals, 0.45 outranks two of them: 5 of 6 pairs.
    assert roc(labels, probs).auc == pytest.approx(5 / 6)
    matrix = confusion(labels, probs, 0.5)
    assert matrix.tolist() == [[2, 1], [1, 1]]
    scores = rates(matrix)
    assert scores == {"accuracy": 3 / 5, "sensitivity": 1 / 2, "specificity": 2 / 3}
    frame = pd.DataFrame({"path": list("abcde"), "label": labels, "prob_abnormal": probs})
    ranked = ranked_examples(frame, 0.5)
    # Errors first by how sure the model was of the wrong class (0.60 > 0.55), then correct calls (0.9, 0.8, 0.7).
    assert ranked["path"].tolist() == ["b", "e", "a", "d", "c"]
    assert roc(np.array([1, 1]), np.array([0.2, 0.9])).auc is None


def test_shortcut_probe_table_shows_each_split_with_tiles_and_the_departure() -> None:
    from app.datasets import shortcut_probe

    assert shortcut_probe({}) is None  # a dataset prepared before the probe
    record = {
        "shortcut_probe": {
            "statistics": {"pure_white": "painted white", "mean_intensity": "mean"},
            "warn_above": 0.7,
            "splits": {
                "train": {"tiles": 10, "pure_white": 0.97, "mean_intensity": 0.6},
                "val": {"tiles": 0, "pure_white": None, "mean_intensity": None},
                "test": {"tiles": 4, "pure_white": 0.5, "mean_intensity": None},
            },
            "warning": "shortcut: painted white alone separates the classes",
        },
        "labels": {"departure": "training tiles whitened"},
    }
    probe = shortcut_probe(record)
    assert probe is not None
    assert list(probe.table.columns) == ["statistic", "train AUC (10 tiles)", "test AUC (4 tiles)"]
    assert probe.table["train AUC (10 tiles)"].tolist() == [0.97, 0.6]
    assert probe.warning == "shortcut: painted white alone separates the classes"
    assert probe.departure == "training tiles whitened"
    assert probe.limit == 0.7
