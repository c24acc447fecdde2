"""Where a method gains or loses against a reference, hospital by hospital: the last round's test AUC and accuracy of
each hospital in every finished cell of an ablation grid, as mean ± sd over seeds per setting, and each setting minus
the reference setting per hospital, paired by seed, with its 95% t interval and the smallest difference the seeds
can detect at 80% power (`federation.ablation.paired`, the formulas of ``paired.md``).

`gastric-fl ablate` pairs the hospitals' average; this says which hospital the average's difference comes from (on
the quick start's dataset, hospital 2 is the grey one).

    .venv/bin/python benchmarks/hospital_paired.py results/tables4567_quickstart --reference strategy-separate \
        --out results/tables4567_quickstart/hospitals.md
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import ablation_folder_problem, emit_report, mean_sd
from federation.ablation import cell_status, cells_folder
from federation.ablation.paired import paired_differences, paired_interval, paired_text
from federation.run_reader import read_run_metrics

CELL = re.compile(r"^(?P<setting>.+)_seed-(?P<seed>\d+)$")
MEASURES = (("test_auc", "test AUC"), ("test_acc", "test accuracy"))

# setting -> hospital -> seed -> measure -> value
Figures = dict[str, dict[int, dict[int, dict[str, float]]]]


def last_round(run: Path) -> dict[int, dict[str, float]]:
    """Each hospital's measures at the run's last round (a measure a hospital lacks there is left out)."""
    records = read_run_metrics(run).records
    if not records:
        return {}
    last = max(int(r["round"]) for r in records)
    return {
        int(r["client"]): {m: float(r[m]) for m, _ in MEASURES if r.get(m) is not None}
        for r in records
        if int(r["round"]) == last
    }


def collect(folder: Path) -> Figures:
    """Every finished cell of an ablation folder (``cells/`` or a published ``cells.tar.xz``), by setting (the
    cell's name without its seed), hospital and seed."""
    figures: Figures = defaultdict(lambda: defaultdict(dict))
    with cells_folder(folder) as cells:
        for cell in sorted(cells.iterdir()):
            match = CELL.match(cell.name)
            if match is None or cell_status(cell) != "finished":
                continue
            for hospital, values in last_round(cell).items():
                figures[match["setting"]][hospital][int(match["seed"])] = values
    return {s: dict(h) for s, h in figures.items()}


def _by_seed(seeds: Mapping[int, Mapping[str, float]], measure: str) -> dict[int, float | None]:
    return {seed: values.get(measure) for seed, values in seeds.items()}


def tables(figures: Figures, reference: str) -> list[str]:
    """Per measure: each setting's hospitals (mean ± sd over seeds), then each setting minus ``reference`` per
    hospital, paired by seed (settings whose name starts with ``reference`` are the reference)."""
    ref = next((s for s in figures if s.startswith(reference)), None)
    hospitals = sorted({h for by_hospital in figures.values() for h in by_hospital})
    head = " | ".join(f"hospital {h}" for h in hospitals)
    lines: list[str] = []
    for measure, name in MEASURES:
        lines += [f"## {name}, last round (mean ± sd over seeds)", "", f"| setting | seeds | {head} |"]
        lines.append("|---|---:|" + "---|" * len(hospitals))
        for setting, by_hospital in figures.items():
            seeds = len({s for h in by_hospital.values() for s in h})
            cells = [
                mean_sd([v[measure] for v in by_hospital.get(h, {}).values() if measure in v], 3) for h in hospitals
            ]
            lines.append(f"| {setting} | {seeds} | {' | '.join(cells)} |")
        lines.append("")
        if ref is None:
            continue
        lines += [
            f"### {name}: setting minus {ref}, paired by seed: mean [95% interval] (MDD); * where it excludes 0",
            "",
            f"| setting | {head} |",
            "|---|" + "---|" * len(hospitals),
        ]
        for setting, by_hospital in figures.items():
            if setting == ref:
                continue
            cells = []
            for h in hospitals:
                diffs = paired_differences(
                    _by_seed(by_hospital.get(h, {}), measure), _by_seed(figures[ref].get(h, {}), measure)
                )
                cells.append(paired_text(paired_interval(diffs)) or "-")
            lines.append(f"| {setting} | {' | '.join(cells)} |")
        lines.append("")
    return lines[:-1]  # the report adds the last line break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="an ablation folder (gastric-fl ablate --out) or a published one")
    parser.add_argument("--reference", default="strategy-separate", help="the reference setting's name or its start")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if (problem := ablation_folder_problem(args.folder)) is not None:
        print(problem, file=sys.stderr)
        return 2
    figures = collect(args.folder)
    if not figures:
        print(
            f"error: {args.folder} holds no finished run yet: run gastric-fl ablate to the end first", file=sys.stderr
        )
        return 2
    if not any(s.startswith(args.reference) for s in figures):
        print(f"error: --reference {args.reference!r} matches no setting of {args.folder}", file=sys.stderr)
        return 2
    emit_report(
        f"Each hospital's figures: {args.folder.name}", "hospital_paired.py", tables(figures, args.reference), args.out
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
