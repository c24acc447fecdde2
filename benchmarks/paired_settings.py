"""Paired differences between the settings of one method in an ablation grid, against one reference setting
(issue: ablations able to show what nhead and the distance metric do).

`gastric-fl ablate` pairs every method with Separate and FedAvg; a researcher reading Table 5 or Table 6 asks
instead whether nhead 3 differs from nhead 6, or Euclidean from Manhattan. For each cell folder of ``GRID/cells/``
(or of ``GRID/cells.tar.xz``, unpacked into a temporary folder by `federation.ablation.cells_folder`: a published
grid) whose name starts with
``--method`` (``strategy-fedsaf``), this reads the final averaged test accuracy and AUC of ``summary.json`` per seed
and gives, for every setting, the paired difference setting minus ``--reference`` over the seeds both finished:
mean, 95% t interval (* where it excludes 0) and the minimum detectable difference at 80% power
(`federation.ablation.paired`, the formulas of ``paired.md``). Writes ``OUT`` (markdown) and prints it.

With ``--reference-grid OTHER`` the reference setting is read from another grid, and every setting of ``GRID``,
the reference's own name included, is paired with it: the same cells trained on two datasets, e.g. Separate on a
copy of the tiles with brightness and colour levels removed (`scripts/morphology_check.py`) against the same
Separate on the raw tiles.

    .venv/bin/python benchmarks/paired_settings.py results/tables4567_seed_like \
        --reference strategy-fedsaf_fim-on_split-on --out results/tables4567_seed_like/paired_settings.md
    .venv/bin/python benchmarks/paired_settings.py results/gastric_tissue/label_skew_stride64/separate_flattened \
        --method strategy-separate --reference strategy-separate --reference-grid results/table7_label_skew_stride64
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.ablation import CELLS_ARCHIVE, cell_status, cells_folder  # noqa: E402
from federation.ablation.paired import paired_differences, paired_interval, paired_text  # noqa: E402

CELL = re.compile(r"^(?P<setting>.+)_seed-(?P<seed>\d+)$")
FIGURES = (("avg_test_acc", "averaged test accuracy"), ("avg_test_auc", "averaged test AUC"))


def read_settings(cells: Path, method: str) -> dict[str, dict[str, dict[int, float | None]]]:
    """``{setting: {figure: {seed: value}}}`` of the finished cells whose name starts with ``method``: a cell still
    running (or failed) also holds a ``summary.json``, whose ``final`` is its latest round, so the run's status
    (`federation.ablation.cell_status`) decides, not the file's presence."""
    out: dict[str, dict[str, dict[int, float | None]]] = defaultdict(lambda: defaultdict(dict))
    for cell in sorted(cells.iterdir()):
        match = CELL.match(cell.name)
        if not match or not match["setting"].startswith(method) or cell_status(cell) != "finished":
            continue
        final = json.loads((cell / "summary.json").read_text(encoding="utf-8")).get("final") or {}
        for key, _ in FIGURES:
            value = final.get(key)
            out[match["setting"]][key][int(match["seed"])] = None if value is None else float(value)
    return out


def markdown(
    settings: dict[str, dict[str, dict[int, float | None]]],
    reference: str,
    command: str,
    against: dict[str, dict[int, float | None]],
    other_grid: bool = False,
) -> str:
    """One row per setting other than ``reference``: the paired difference of each figure to ``against`` (the
    reference's ``{figure: {seed: value}}``). With ``other_grid`` (the reference read from another grid), one row
    per setting, ``reference``'s namesake included."""
    lines = [
        f"# Paired differences to {reference}" + (" of another grid" if other_grid else ""),
        "",
        f"Command: `{command}`. Per setting, its final figure minus the reference's, paired by seed over the seeds "
        "both finished: mean [95% t interval] (* where it excludes 0) (MDD: the smallest difference the seeds could "
        "detect with 80% power, `federation.ablation.paired`).",
        "",
        "| setting | seeds | " + " | ".join(f"Δ {name}" for _, name in FIGURES) + " |",
        "|---|---|" + "---|" * len(FIGURES),
    ]
    for setting in sorted(settings):
        if setting == reference and not other_grid:
            continue
        cells, seeds = [], 0
        for key, _ in FIGURES:
            differences = paired_differences(settings[setting][key], against[key])
            seeds = max(seeds, len(differences))
            cells.append(paired_text(paired_interval(differences)) or "n/a")
        lines.append(f"| {setting} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", type=Path, help="an ablation folder (cells/) or a published one (cells.tar.xz)")
    parser.add_argument("--reference", required=True, help="the setting every other is compared with")
    parser.add_argument("--method", default="strategy-fedsaf", help="the prefix of the settings compared")
    parser.add_argument("--out", type=Path, help="markdown file to write (default: print only)")
    parser.add_argument(
        "--reference-grid", type=Path, help="read the reference setting from this grid (default: GRID itself)"
    )
    args = parser.parse_args(argv)
    command = " ".join(
        [".venv/bin/python benchmarks/paired_settings.py", *(argv if argv is not None else sys.argv[1:])]
    )
    reference_grid = args.reference_grid if args.reference_grid is not None else args.grid
    # one read per grid (a published grid is unpacked once): one grid is read whole, then filtered
    same = reference_grid == args.grid
    prefixes = {args.grid: ""} if same else {args.grid: args.method, reference_grid: args.reference}
    read: dict[Path, dict[str, dict[str, dict[int, float | None]]]] = {}
    for grid, prefix in prefixes.items():
        with cells_folder(grid) as cells:
            if not cells.is_dir():
                print(f"error: {grid} holds neither cells/ nor {CELLS_ARCHIVE}; give an ablation folder")
                return 2
            read[grid] = read_settings(cells, prefix)
    settings = {name: figures for name, figures in read[args.grid].items() if name.startswith(args.method)}
    if args.reference not in read[reference_grid]:
        present = ", ".join(sorted(read[reference_grid]))
        print(f"error: no finished cell of {args.reference!r} in {reference_grid}; settings: {present}")
        return 2
    against = read[reference_grid][args.reference]
    text = markdown(settings, args.reference, command, against, other_grid=args.reference_grid is not None)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
