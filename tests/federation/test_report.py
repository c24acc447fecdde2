"""Run report: hand-computed averaged/std/best figures on unequal clients, tables, curves, transmitted values."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from federation.errors import FederationError
from federation.report import (
    all_figures,
    load_run,
    markdown_table,
    per_hospital,
    round_stats,
    run_figures,
    summarise,
    transmitted_values,
    write_report,
)
from models import base_keys, create_model, split_units


def _record(r: int, c: int, acc: float, auc: float | None, loss: float, sent: int) -> dict[str, Any]:
    return {
        "round": r,
        "client": c,
        "train_loss": loss,
        "test_loss": loss + 0.1,
        "test_acc": acc,
        "test_auc": auc,
        "fisher_trace": None,
        "values_sent": sent,
        "values_received": sent // 2,
        "seconds": 1.0,
        "num_train": 10 * (c + 1),
        "num_test": 4,
    }


# round 1: acc 0.5, 0.7, 0.9 ; round 2: acc 0.6, 1.0, 0.8 with client 1's AUC undefined
METRICS = [
    _record(1, 0, 0.5, 0.6, 0.9, 100),
    _record(1, 1, 0.7, 0.8, 0.7, 100),
    _record(1, 2, 0.9, 1.0, 0.5, 100),
    _record(2, 0, 0.6, 0.5, 0.6, 100),
    _record(2, 1, 1.0, None, 0.3, 100),
    _record(2, 2, 0.8, 0.9, 0.3, 100),
]


def test_round_stats_are_means_and_population_stds_over_clients() -> None:
    first, second = round_stats(METRICS)
    assert first.avg_test_acc == pytest.approx(0.7)
    # population std of (0.5, 0.7, 0.9): sqrt((0.04 + 0 + 0.04) / 3)
    assert first.std_test_acc == pytest.approx((0.08 / 3) ** 0.5)
    assert first.avg_test_auc == pytest.approx(0.8)
    assert second.avg_test_acc == pytest.approx(0.8)
    # the single-class client is left out of the AUC figures: mean of (0.5, 0.9) = 0.7, std 0.2
    assert second.avg_test_auc == pytest.approx(0.7)
    assert second.std_test_auc == pytest.approx(0.2)
    assert second.avg_train_loss == pytest.approx(0.4)
    assert (second.values_sent, second.values_received) == (300, 150)
    assert (first.auc_hospitals, second.auc_hospitals) == (3, 2)
    assert (first.seconds, second.seconds) == (3.0, 3.0)


def test_the_dashboard_reads_a_rounds_figures_from_the_same_computation() -> None:
    """``app.run_records.per_round`` over a frame of the records gives `round_stats`' figures, exactly."""
    from app.run_records import metrics_frame, per_round

    records = [dict(r, seconds=r["seconds"] * (1 + r["client"])) for r in METRICS]  # unequal: 1, 2, 3 s
    table = per_round(metrics_frame(records)).set_index("round")
    rounds = round_stats(records)
    assert [s.round for s in rounds] == table.index.tolist() == [1, 2]
    for stats in rounds:
        row = table.loc[stats.round]
        assert row["acc_mean"] == stats.avg_test_acc
        assert row["acc_std"] == stats.std_test_acc
        assert row["auc_mean"] == stats.avg_test_auc
        assert row["auc_std"] == stats.std_test_auc
        assert (row["auc_clients"], row["values_sent"], row["values_received"]) == (
            stats.auc_hospitals, stats.values_sent, stats.values_received,
        )  # fmt: skip
        assert row["seconds"] == stats.seconds == 6.0
    assert table["values_total"].tolist() == [450, 900]


def test_run_figures_pick_the_last_and_the_best_round() -> None:
    figures = run_figures(round_stats(METRICS))
    assert figures["final"]["round"] == 2
    assert figures["best"] == {"round": 2, "avg_test_acc": pytest.approx(0.8), "avg_test_auc": pytest.approx(0.7)}
    assert figures["values_per_round"] == {"sent": 300, "received": 150}
    assert run_figures([]) == {"final": None, "best": None, "values_per_round": None}


def _write_run(folder: Path, strategy: str, metrics: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(f'[strategy]\nname = "{strategy}"\nnhead = 1\n[model]\nname = "m"\n')
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "aggregation.jsonl").write_text(json.dumps({"round": 1, "seconds": 2.0}) + "\n")
    (folder / "summary.json").write_text(json.dumps({"status": "finished"}))
    return folder


def test_summary_rows_tables_and_curves(tmp_path: Path) -> None:
    a = load_run(_write_run(tmp_path / "a", "fedavg", METRICS))
    b = load_run(_write_run(tmp_path / "b", "fedrep", METRICS[:3]))
    rows = summarise([a, b])
    assert [r["run"] for r in rows] == ["a", "b"]
    assert rows[0]["strategy"] == "fedavg"
    assert rows[0]["rounds"] == 2
    assert rows[0]["avg_test_acc"] == pytest.approx(0.8)
    assert rows[0]["best_round"] == 2
    assert rows[1]["rounds"] == 1
    assert rows[1]["avg_test_acc"] == pytest.approx(0.7)
    assert rows[0]["seconds_per_round"] == 2.0
    hospitals = per_hospital([a])
    assert [(h["client"], h["test_auc"]) for h in hospitals] == [(0, 0.5), (1, None), (2, 0.9)]
    table = markdown_table(rows, ["run", "avg_test_acc", "avg_test_auc"])
    assert table.splitlines()[2] == "| a | 0.8000 | 0.7000 |"
    paths = write_report([a, b], tmp_path / "out")
    assert paths["curves"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with paths["csv"].open() as handle:
        assert [r["run"] for r in csv.DictReader(handle)] == ["a", "b"]
    markdown = paths["markdown"].read_text()
    assert "| a | 1 | 20 | 4 | 1.0000 | - |" in markdown  # a's last round is 2
    assert "| b | 0 | 10 | 4 | 0.5000 | 0.6000 |" in markdown  # b's last round is 1


def test_all_figures_add_the_worst_hospital_best_auc_total_values_and_curves(tmp_path: Path) -> None:
    run = load_run(_write_run(tmp_path / "a", "fedavg", METRICS))
    figures = all_figures(run)
    assert {k: v for k, v in figures.items() if k in summarise([run])[0]} == summarise([run])[0]
    # last round: acc 0.6, 1.0, 0.8 and AUC 0.5, -, 0.9 -> the worst hospital's 0.6 and 0.5
    assert figures["worst_test_acc"] == pytest.approx(0.6)
    assert figures["worst_test_auc"] == pytest.approx(0.5)
    assert figures["best_avg_test_auc"] == pytest.approx(0.8)  # round 1's (0.6 + 0.8 + 1.0) / 3
    assert figures["values_total"] == 2 * (300 + 150)
    assert figures["curve_avg"] == [pytest.approx(0.7), pytest.approx(0.8)]
    assert figures["curve_std"] == [pytest.approx((0.08 / 3) ** 0.5), pytest.approx((0.08 / 3) ** 0.5)]


def test_missing_run_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FederationError, match="not a run directory"):
        load_run(tmp_path)


def test_transmitted_values_equal_the_state_dict_numel_of_shared_keys() -> None:
    rows = transmitted_values("mobilenet_v3_small", (0, 3, 6, 9, 12))
    model = create_model("mobilenet_v3_small")
    state, units = model.state_dict(), split_units(model)
    params = dict(model.named_parameters())
    for row in rows:
        keys = base_keys(units, row["nhead"])
        assert row["state_dict_values"] == sum(state[k].numel() for k in keys)
        assert row["parameters"] == sum(params[k].numel() for k in keys if k in params)
    assert rows[0]["state_dict_values"] == sum(v.numel() for v in state.values())
    assert rows[-1]["state_dict_values"] == 5510  # features.0-2, counted by hand in tests/models
    assert [r["shared_units"] for r in rows] == [15, 12, 9, 6, 3]
