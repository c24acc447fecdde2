"""Two published ablation folders side by side: each row of Tables 4-7 (``table*_*.csv``) in both, with its seeds,
averaged test accuracy and AUC (mean ± std over seeds) in each, e.g. the classic tissue's tables beside the gastric
tissue's (issue: tissue a model must read). Rows are matched on their settings (every column that is not a figure).

    .venv/bin/python benchmarks/tables_compare.py results/honest_tables456_site_shift results/tables4567_site_shift \
        --labels "classic, raw tiles" "gastric" [--out FILE.md]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

FIGURES = (("avg_test_acc", "acc"), ("avg_test_auc", "AUC"))


def _rows(path: Path) -> dict[tuple[str, ...], dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return {}
    keys = [k for k in rows[0] if not k.endswith(("_mean", "_std")) and k != "seeds"]
    return {tuple(f"{k}={r[k]}" for k in keys if r[k] not in ("", "-")): r for r in rows}


def _cell(row: dict[str, str] | None, figure: str) -> str:
    if row is None or not row.get(f"{figure}_mean"):
        return "-"
    return f"{float(row[f'{figure}_mean']):.3f} ± {float(row[f'{figure}_std'] or 0):.3f}"


def compare(old: Path, new: Path, labels: tuple[str, str]) -> str:
    lines = [f"# {old.name} beside {new.name}", ""]
    for table in sorted({p.name for p in old.glob("table*_*.csv")} | {p.name for p in new.glob("table*_*.csv")}):
        a = _rows(old / table) if (old / table).is_file() else {}
        b = _rows(new / table) if (new / table).is_file() else {}
        head = " | ".join(f"{label}: {name}" for label in labels for _, name in FIGURES)
        lines += [f"## {table.removesuffix('.csv')}", "", f"| row | seeds | {head} |", "|---|---|" + "---|" * 4]
        for key in list(a) + [k for k in b if k not in a]:
            ra, rb = a.get(key), b.get(key)
            seeds = f"{ra['seeds'] if ra else 0} / {rb['seeds'] if rb else 0}"
            cells = [_cell(r, f) for r in (ra, rb) for f, _ in FIGURES]
            lines.append(f"| {', '.join(key)} | {seeds} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--labels", nargs=2, default=("old", "new"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    for folder in (args.old, args.new):
        if not any(folder.glob("table*_*.csv")):
            print(f"error: {folder} holds no table*_*.csv: give a published ablation folder")
            return 2
    text = compare(args.old, args.new, tuple(args.labels))
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
