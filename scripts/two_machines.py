"""The same run on two machines (issue 30): published cells of different grids that have the same configuration and
seed (the default FedSAF, FedAvg and FedAMP cells of Tables 4-6 and the methods tables' runs of those methods),
trained on different machines, against each other.

A cell's machine is the one its ``summary.json`` names (``machines``); the published cells were trained before runs
recorded it, so theirs is told by where the dataset lay (``dataset``): under ``/tmp/data/`` on the lent 16-core
machine, elsewhere on this one. Two cells pair when their ``config.toml`` files are equal apart from
``data.path`` and ``run.name``. A pair from one machine must agree exactly (each machine repeats its own runs); a
pair across machines shows how much a CPU and torch build change a run. Writes
``results/honest_evaluation/two_machines.md``.

    .venv/bin/python scripts/two_machines.py
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.ablation import cells_folder  # noqa: E402
from federation.derived import config_from_text  # noqa: E402
from federation.report import load_run, summary_row  # noqa: E402

RESULTS = ROOT / "results"
OUT = RESULTS / "honest_evaluation" / "two_machines.md"
REGIMES = ("data_poor", "site_shift", "label_skew", "seed_like")
PAIRS = {
    "fedsaf": "strategy-fedsaf_fim-on_split-on",
    "fedavg": "strategy-fedavg_nhead-0",
    "fedamp": "strategy-fedamp_nhead-0",
}
LENT = "/tmp/data/"


def _config(cell: Path) -> dict[str, Any]:
    """The cell's configuration with every default filled in (older runs' files leave out later keys), without the
    dataset's path and the run's name."""
    raw = dataclasses.asdict(config_from_text((cell / "config.toml").read_text(encoding="utf-8"), str(cell)))
    raw["data"].pop("path")
    raw["run"].pop("name")
    return raw


def _last_accuracy(cell: Path) -> float:
    """The last round's averaged test accuracy, as the published tables compute it (`federation.report`)."""
    return float(summary_row(load_run(cell))["avg_test_acc"])


def _machine(cell: Path) -> str:
    summary = json.loads((cell / "summary.json").read_text(encoding="utf-8"))
    if summary.get("machines"):  # runs record their machine now (federation.provenance.machine)
        return " then ".join(summary["machines"])
    return "16-core Xeon" if str(summary["dataset"]).startswith(LENT) else "2-core EPYC"


def main() -> None:
    lines = [
        "# The same run on two machines",
        "",
        "Command: `.venv/bin/python scripts/two_machines.py`. Cells of `honest_tables456_<regime>/` and "
        "`honest_methods_<regime>/` with equal configurations (apart from the dataset's path and the run's name) "
        "and seeds; last-round averaged test accuracy.",
        "",
        "| regime | method | seed | Tables 4-6 cell | machine | methods cell | machine | |difference| |",
        "|---|---|---:|---:|---|---:|---|---:|",
    ]
    across: list[float] = []
    same: list[float] = []
    for regime in REGIMES:
        # each folder's runs from its cells.tar.xz (or cells/ where unpacked)
        with (
            cells_folder(RESULTS / f"honest_tables456_{regime}") as tables_cells,
            cells_folder(RESULTS / f"honest_methods_{regime}") as methods_cells,
        ):
            _pairs(regime, tables_cells, methods_cells, lines, across, same)
    lines.append("")
    if across:
        lines.append(
            f"Across machines: {len(across)} pairs, |difference| median {statistics.median(across):.3f}, mean "
            f"{statistics.fmean(across):.3f}, largest {max(across):.3f}."
        )
    if same:
        lines.append(f"On one machine: {len(same)} pairs, largest |difference| {max(same):.3f}.")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[-2:]))
    print(f"written: {OUT}")


def _pairs(
    regime: str, tables_cells: Path, methods_cells: Path, lines: list[str], across: list[float], same: list[float]
) -> None:
    """The rows of one regime: each Tables 4-6 cell beside the methods cell of the same configuration and seed."""
    for method, prefix in PAIRS.items():
        for seed in range(3):
            a = tables_cells / f"{prefix}_seed-{seed}"
            b = methods_cells / f"strategy-{method}_seed-{seed}"
            if not (a / "metrics.jsonl").is_file() or not (b / "metrics.jsonl").is_file():
                continue
            if _config(a) != _config(b):
                continue
            acc_a, acc_b = _last_accuracy(a), _last_accuracy(b)
            ma, mb = _machine(a), _machine(b)
            diff = abs(acc_a - acc_b)
            (across if ma != mb else same).append(diff)
            lines.append(f"| {regime} | {method} | {seed} | {acc_a:.3f} | {ma} | {acc_b:.3f} | {mb} | {diff:.3f} |")


if __name__ == "__main__":
    main()
