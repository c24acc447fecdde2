"""scripts/results_overview.py: the cross-regime overview is read from the published tables, figure for figure."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

from support.scripts import load_script


def _module() -> ModuleType:
    return load_script("results_overview")


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _table_row(strategy: str, wrap: str, seeds: str, acc: str, std: str, auc: str) -> dict[str, str]:
    return {
        "strategy": strategy,
        "strategy.wrap": wrap,
        "seeds": seeds,
        "avg_test_acc_mean": acc,
        "avg_test_acc_std": std,
        "avg_test_auc_mean": auc,
    }


def _paired_row(method: str, reference: str, n: str, mean: str, low: str, high: str) -> dict[str, str]:
    return {
        "strategy.wrap": "",
        "method": method,
        "reference": reference,
        "n": n,
        "avg_test_acc_diff_mean": mean,
        "avg_test_acc_diff_low": low,
        "avg_test_acc_diff_high": high,
    }


def test_overview_reads_each_regime_table_and_its_paired_differences(tmp_path: Path) -> None:
    folder = tmp_path / "methods_digits"
    folder.mkdir()
    _write(
        folder / "table7_methods.csv",
        [
            _table_row("separate", "", "3", "0.8", "0.05", "0.9"),
            _table_row("fedavg", "", "3", "0.85", "", "0.95"),
            _table_row("fedavg", "['fedlws']", "2", "0.9125", "0.0125", "0.975"),
            _table_row("fedprox", "", "0", "", "", ""),  # not run: left out
        ],
    )
    _write(
        folder / "paired.csv",
        [
            _paired_row("fedavg", "separate", "3", "0.05", "0.01", "0.09"),
            _paired_row("fedavg+fedlws", "separate", "2", "0.1", "-0.2", "0.4"),
            _paired_row("fedavg+fedlws", "fedavg", "1", "0.0625", "", ""),
            _paired_row("separate", "fedavg", "3", "-0.05", "-0.09", "-0.01"),
            # a row of another grid setting (a paired table of a grid over more than the method) is not this one
            {**_paired_row("fedavg", "separate", "3", "0.5", "0.4", "0.6"), "strategy.wrap": "['fedtlu']"},
        ],
    )
    (tmp_path / "methods_site_shift").mkdir()  # a regime folder without tables is skipped

    lines = _module().overview(tmp_path).splitlines()

    assert lines == [
        "**digits** ([tables](methods_digits/results.md), [raw runs](methods_digits/cells.tar.xz))",
        "",
        "| method | seeds | averaged test acc | averaged AUC | Δ acc vs Separate [95% CI] | Δ acc vs FedAvg |",
        "|---|---|---|---|---|---|",
        "| separate | 3 | 0.800 ± 0.050 | 0.900 | — | -0.050 [-0.090, -0.010] * |",
        "| fedavg | 3 | 0.850 ± 0.000 | 0.950 | +0.050 [+0.010, +0.090] * | — |",
        "| fedavg+fedlws | 2 | 0.912 ± 0.013 | 0.975 | +0.100 [-0.200, +0.400] | +0.062 (n=1) |",
    ]


def test_a_paired_table_with_the_detectable_difference_shows_it() -> None:
    interval = _module()._interval
    row = {**_paired_row("fedavg", "separate", "3", "0.05", "0.01", "0.09"), "avg_test_acc_diff_mdd": "0.0612"}
    assert interval(row) == "+0.050 [+0.010, +0.090] * (MDD 0.061)"
    # a table written before ablate reported it (no column), and one seed (an empty cell): no MDD
    assert interval(_paired_row("fedavg", "separate", "3", "0.05", "0.01", "0.09")) == "+0.050 [+0.010, +0.090] *"
    one = {**_paired_row("fedavg", "fedlws", "1", "0.0625", "", ""), "avg_test_acc_diff_mdd": ""}
    assert interval(one) == "+0.062 (n=1)"
