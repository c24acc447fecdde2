"""The FedSAF paper's Table 7 row beside ours: every method's accuracy over an ablation folder's cells (one run per
method and seed), next to the figure the paper reports for Fashion-MNIST (paper 001, Table 7, "Noniid-Unbalanced
Dataset Generalization: Best_Accuracy"), with paired differences against FedSAF and the smallest difference the
seeds can detect (`federation.ablation.paired`).

Three measures of a run, from its ``metrics.jsonl`` (each hospital's ``test_acc`` and ``num_test`` per round):

- **best, pooled**: the paper's measure as PFLlib computes it (``serverbase.evaluate``: the hospitals' correct test
  predictions summed over their test images summed, then the best round, ``max(rs_test_acc)``). The round is picked
  on the test split itself, so it is optimistic.
- **last, pooled**: the same pooled accuracy at the last round.
- **last, mean**: the mean of the hospitals' accuracies at the last round (each hospital counts once: the figure
  the project's own tables report). Under PFLlib's unbalanced partition one hospital can hold half the images, so
  pooled and mean can differ.

    .venv/bin/python benchmarks/table7_paper.py data/ablations/table7_fmnist_pat10 \
        --out benchmarks/results/table7_fmnist_pat10.md
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ablation_folder_problem, command_line, machine, mean_sd, write_result
from federation.ablation import cell_status
from federation.ablation.archive import cells_folder
from federation.ablation.paired import paired_interval, paired_text

# Paper 001, Table 7, the Fashion-MNIST column (20 clients); Separate is not in the paper's table.
PAPER = {"fedavg": 0.6677, "fedprox": 0.6654, "fedrep": 0.9586, "fedamp": 0.9622, "fedsaf": 0.9642}
METHODS = ("separate", "fedavg", "fedprox", "fedrep", "fedamp", "fedsaf")
MEASURES = (("best_pooled", "best, pooled (optimistic)"), ("last_pooled", "last, pooled"), ("last_mean", "last, mean"))


@dataclass(frozen=True)
class RunFigures:
    """One finished run's method, seed, rounds and its three accuracies (module docstring)."""

    method: str
    seed: int
    rounds: int
    best_round: int
    best_pooled: float
    last_pooled: float
    last_mean: float


def run_figures(run: Path) -> RunFigures | None:
    """A cell's figures, or ``None`` for a cell that has not finished (`federation.ablation.cell_status`, as the
    ablation's own tables decide)."""
    if cell_status(run) != "finished":
        return None
    config = tomllib.loads((run / "config.toml").read_text(encoding="utf-8"))
    by_round: dict[int, list[Mapping[str, float]]] = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            by_round.setdefault(int(record["round"]), []).append(record)
    if not by_round:
        return None
    pooled = {
        r: sum(float(x["test_acc"]) * int(x["num_test"]) for x in rows) / sum(int(x["num_test"]) for x in rows)
        for r, rows in by_round.items()
    }
    last = max(by_round)
    best = max(pooled, key=lambda r: (pooled[r], -r))  # the earliest round of the best accuracy
    return RunFigures(
        method=str(config["strategy"]["name"]),
        seed=int(config["run"]["seed"]),
        rounds=last,
        best_round=best,
        best_pooled=pooled[best],
        last_pooled=pooled[last],
        last_mean=statistics.fmean(float(x["test_acc"]) for x in by_round[last]),
    )


def collect(folder: Path) -> list[RunFigures]:
    """Every finished cell of an ablation folder (``folder/cells/*``, or a published folder's ``cells.tar.xz``), in
    method then seed order."""
    with cells_folder(folder) as cells:
        found = [f for cell in sorted(cells.glob("*")) if (f := run_figures(cell)) is not None]
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(found, key=lambda f: (order.get(f.method, len(order)), f.method, f.seed))


def table(runs: Sequence[RunFigures]) -> str:
    """The markdown tables: each method's figures (mean ± sd over seeds) beside the paper's, then FedSAF minus each
    method, paired by seed, for each measure."""
    methods = list(dict.fromkeys(r.method for r in runs))
    head = " | ".join(name for _, name in MEASURES)
    lines = [f"| method | paper (best) | seeds | {head} |", "|---|---:|---:|" + "---:|" * len(MEASURES)]
    for method in methods:
        mine = [r for r in runs if r.method == method]
        paper = f"{PAPER[method]:.4f}" if method in PAPER else "-"
        cells = [mean_sd([getattr(r, key) for r in mine], 4) for key, _ in MEASURES]
        lines.append(f"| {method} | {paper} | {len(mine)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "FedSAF minus each method, paired by seed: mean [95% interval] (MDD: the smallest difference these seeds "
        "detect at alpha 0.05 with 80% power); * where the interval excludes 0.",
        "",
        f"| FedSAF minus | pairs | {head} |",
    ]
    lines.append("|---|---:|" + "---|" * len(MEASURES))
    fedsaf = {r.seed: r for r in runs if r.method == "fedsaf"}
    for method in methods:
        if method == "fedsaf" or not fedsaf:
            continue
        other = {r.seed: r for r in runs if r.method == method}
        seeds = sorted(set(fedsaf) & set(other))
        cells = []
        for key, _ in MEASURES:
            stats = paired_interval([getattr(fedsaf[s], key) - getattr(other[s], key) for s in seeds])
            cells.append(paired_text(stats) or "-")
        lines.append(f"| {method} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(runs: Sequence[RunFigures], path: Path) -> None:
    """One row per run: the raw figures behind the table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["method", "seed", "rounds", "best_round", "best_pooled", "last_pooled", "last_mean"])
        for r in runs:
            writer.writerow(
                [r.method, r.seed, r.rounds, r.best_round, f"{r.best_pooled:.6f}", f"{r.last_pooled:.6f}",
                 f"{r.last_mean:.6f}"]
            )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="an ablation folder (gastric-fl ablate --out)")
    parser.add_argument("--out", type=Path, help="write the report here (and the runs' figures beside it as .csv)")
    args = parser.parse_args(argv)
    if (problem := ablation_folder_problem(args.folder)) is not None:
        print(problem)
        return 2
    runs = collect(args.folder)
    if not runs:
        print(f"error: {args.folder} holds no finished run yet: run gastric-fl ablate to the end first")
        return 2
    rounds = sorted({r.rounds for r in runs})
    text = "\n".join(
        [
            f"# The paper's Table 7 beside ours: {args.folder.name}",
            "",
            f"Command: `{command_line('table7_paper.py')}`",
            "",
            f"{machine()}. Runs: {len(runs)}, rounds {', '.join(map(str, rounds))}.",
            "",
            table(runs),
            "",
        ]
    )
    print(text)
    if args.out is not None:
        write_result(args.out, text)
        write_csv(runs, args.out.with_suffix(".csv"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
