"""How the Table 7 figures move with the data cut (issue 51, item 4): each method's seed-0 run on two or more
preparations of Fashion-MNIST that differ only in how many images were taken (`benchmarks/idx_subset.py`), by the
paper's measure (best pooled accuracy over rounds, picked on test: optimistic) and at the last round
(`benchmarks/table7_paper.py` computes both, as PFLlib pools them), with the change from the first folder to each
other one (a method missing from a folder shows "-").

One seed: each change says the direction, not the spread (the seeds' spread at a tenth of the images is in
`results/table7_fmnist_pat2/paper_row.md`: 0.007-0.042 by method).

    .venv/bin/python benchmarks/table7_data.py results/table7_fmnist_pat2=7000 \
        results/table7_fmnist_pat2_data=21000 results/table7_fmnist_pat2_full=70000 \
        --out results/table7_fmnist_pat2_data/data.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ablation_folder_problem, emit_report
from benchmarks.table7_paper import METHODS, PAPER, RunFigures, collect


def seed0(runs: Sequence[RunFigures]) -> dict[str, RunFigures]:
    """Each method's seed-0 run."""
    return {r.method: r for r in runs if r.seed == 0}


def data_table(columns: Sequence[tuple[str, dict[str, RunFigures]]]) -> list[str]:
    """One row per method of the first column: the paper's figure, then per column (a label such as the number of
    images, and its seed-0 runs) the best pooled accuracy with its round and the last round's ("-" where that column
    has no run of the method), then per later column the change in both from the first column."""
    labels = [label for label, _ in columns]
    first_label, first_runs = columns[0]
    header = " | ".join(f"{label}: best pooled (round) / last pooled" for label in labels)
    changes = " | ".join(f"change {first_label} -> {label}: best / last" for label in labels[1:])
    lines = [f"| method | paper | {header} | {changes} |", "|---|---:|" + "---|" * (2 * len(columns) - 1)]
    for method in (m for m in METHODS if m in first_runs):
        first = first_runs[method]
        cells, deltas = [], []
        for index, (_, figures) in enumerate(columns):
            run = figures.get(method)
            cells.append("-" if run is None else f"{run.best_pooled:.3f} ({run.best_round}) / {run.last_pooled:.3f}")
            if index > 0:
                deltas.append(
                    "-"
                    if run is None
                    else f"{run.best_pooled - first.best_pooled:+.3f} / {run.last_pooled - first.last_pooled:+.3f}"
                )
        lines.append(f"| {method} | {PAPER.get(method, '-')} | {' | '.join(cells)} | {' | '.join(deltas)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="FOLDER=LABEL: an ablation folder and its label (e.g. 7000)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    columns: list[tuple[str, dict[str, RunFigures]]] = []
    for item in args.folders:
        folder, sep, label = item.rpartition("=")
        if not sep or not folder or not label:
            print(f"error: {item!r}: write FOLDER=LABEL, e.g. results/table7_fmnist_pat2=7000", file=sys.stderr)
            return 2
        path = Path(folder)
        if (problem := ablation_folder_problem(path)) is not None:
            print(problem, file=sys.stderr)
            return 2
        figures = seed0(collect(path))
        if not figures:
            print(f"error: {folder}: no finished seed-0 run there; run its ablate command first", file=sys.stderr)
            return 2
        columns.append((label, figures))
    if len(columns) < 2:
        print("error: give at least two FOLDER=LABEL to compare", file=sys.stderr)
        return 2
    title = f"Table 7 on Fashion-MNIST: seed 0 at {', '.join(label for label, _ in columns)} images"
    emit_report(title, "table7_data.py", data_table(columns), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
