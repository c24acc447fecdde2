"""How the Table 7 figures move with the rounds cut (issue 51, item 4): each method's seed-0 run at 5 rounds (a
published Table 7 folder) beside the same configuration at more rounds (another ablation folder), by the paper's
measure (best pooled accuracy over rounds, optimistic) and at the last round, and the pooled accuracy at round 5 of
the longer run, which repeats the 5-round run where the machine is the same (`benchmarks/table7_paper.py`).

    .venv/bin/python benchmarks/table7_rounds.py results/table7_fmnist_pat2 results/table7_fmnist_pat2_rounds \
        --out results/table7_fmnist_pat2_rounds/rounds.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import emit_report
from benchmarks.table7_paper import METHODS, PAPER
from federation.ablation.archive import cells_folder
from federation.run_reader import read_run_metrics


def pooled_by_round(run: Path) -> dict[int, float]:
    """PFLlib's pooled test accuracy per round: correct test predictions over test images, all hospitals."""
    by_round: dict[int, list[dict[str, float]]] = {}
    for record in read_run_metrics(run).records:
        by_round.setdefault(int(record["round"]), []).append(record)
    return {
        r: sum(float(x["test_acc"]) * int(x["num_test"]) for x in rows) / sum(int(x["num_test"]) for x in rows)
        for r, rows in by_round.items()
    }


def seed0_figures(folder: Path) -> dict[str, dict[int, float]]:
    """Each method's seed-0 cell of an ablation folder (unpacked from its archive when published), by round."""
    with cells_folder(folder) as cells:
        runs = sorted(c for c in cells.iterdir() if c.name.endswith("_seed-0"))
        return {m: pooled_by_round(c) for m in METHODS for c in runs if c.name.startswith(f"strategy-{m}_")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("short", type=Path, help="the published 5-round folder")
    parser.add_argument("long", type=Path, help="the folder of the longer runs")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    short, long = seed0_figures(args.short), seed0_figures(args.long)
    lines = [
        "| method | paper | 5 rounds: best pooled / last pooled | longer: best pooled (round) / last pooled |"
        " change, best | round 5 of the longer run |",
        "|---|---:|---|---|---|---|",
    ]
    for method in (m for m in METHODS if m in short and m in long):
        a, b = short[method], long[method]
        best_a = max(a.values())
        best = max(b, key=lambda r: (b[r], -r))
        same = "equal to the 5-round run" if abs(b[5] - a[max(a)]) < 1e-6 else "differs"
        lines.append(
            f"| {method} | {PAPER.get(method, '-')} | {best_a:.3f} / {a[max(a)]:.3f} | {b[best]:.3f} ({best}) / "
            f"{b[max(b)]:.3f} | {b[best] - best_a:+.3f} | {b[5]:.3f} ({same}) |"
        )
    emit_report("Table 7 on Fashion-MNIST: 5 rounds against more (seed 0)", "table7_rounds.py", lines, args.out)


if __name__ == "__main__":
    main()
