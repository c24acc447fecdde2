"""Print the cross-regime overview of results/README.md from the published ablation folders.

For each ``results/methods_<regime>/`` written by ``gastric-fl ablate --publish``: every method's last-round
averaged test accuracy (mean ± sample std over seeds, from ``table7_methods.csv``) and its paired differences to
Separate and to FedAvg over the same seeds (mean [95% t interval] and, in a ``paired.csv`` that has it, the minimum
detectable difference at 80% power: ``(MDD m)``). Nothing is trained and
nothing is computed beyond reading those two files, so the overview cannot drift from the tables behind it.

    .venv/bin/python scripts/results_overview.py [results]
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

REGIMES = ("data_poor", "site_shift", "label_skew", "seed_like", "digits")


def _label(row: dict[str, str], keys: list[str]) -> str:
    """The method label ``federation.ablation.method_label`` gives the row's runs (the one ``paired.csv`` uses):
    ``fedavg``, ``fedavg+fedlws``, or the strategy with its own settings, e.g. ``depthwise_fim (reverse=true)``."""
    name = row["strategy"]
    extras = []
    for key in keys:
        value = row.get(key, "")
        if key == "strategy" or value in ("", "-", "[]"):
            continue
        if key == "strategy.wrap":
            name = "+".join([name, *value.strip("[]").replace("'", "").replace('"', "").split(", ")])
        else:
            shown = value.lower() if value in ("True", "False") else value
            extras.append(f"{key.removeprefix(row['strategy'] + '.')}={shown}")
    return f"{name} ({', '.join(extras)})" if extras else name


def _interval(row: dict[str, str] | None) -> str:
    if row is None or row["avg_test_acc_diff_mean"] in ("", "None"):
        return "n/a"
    mean, low, high = row["avg_test_acc_diff_mean"], row["avg_test_acc_diff_low"], row["avg_test_acc_diff_high"]
    if low in ("", "None"):
        return f"{float(mean):+.3f} (n={row['n']})"
    mark = " *" if float(low) > 0 or float(high) < 0 else ""
    mdd = row.get("avg_test_acc_diff_mdd", "")  # absent from tables written before ablate reported it
    detectable = "" if mdd in ("", "None") else f" (MDD {float(mdd):.3f})"
    return f"{float(mean):+.3f} [{float(low):+.3f}, {float(high):+.3f}]{mark}{detectable}"


def overview(root: Path) -> str:
    """The Markdown overview: one table per regime found under ``root``."""
    parts = []
    for regime in REGIMES:
        folder = root / f"methods_{regime}"
        table = folder / "table7_methods.csv"
        if not table.is_file():
            continue
        with table.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        keys = list(rows[0])[: list(rows[0]).index("seeds")]
        paired: dict[tuple[str, str], dict[str, str]] = {}
        if (folder / "paired.csv").is_file():
            with (folder / "paired.csv").open(encoding="utf-8") as handle:
                reader = csv.DictReader(handle)
                fields = list(reader.fieldnames or [])
                context = fields[: fields.index("method")]  # the other grid settings: plain rows have none set
                for row in reader:
                    if all(row[k] in ("", "-", "[]") for k in context):
                        paired[(row["method"], row["reference"])] = row
        header = "| method | seeds | averaged test acc | averaged AUC | Δ acc vs Separate [95% CI] | Δ acc vs FedAvg |"
        lines = [
            f"**{regime}** ([tables](methods_{regime}/results.md), [raw runs](methods_{regime}/cells.tar.xz))\n",
            header,
            "|---|---|---|---|---|---|",
        ]
        for row in rows:
            if row["seeds"] == "0":  # not run yet
                continue
            label = _label(row, keys)
            versus = {ref: _interval(paired.get((label, ref))) for ref in ("separate", "fedavg")}
            versus[label] = "—" if label in versus else ""
            lines.append(
                f"| {label} | {row['seeds']} | {float(row['avg_test_acc_mean']):.3f} ± "
                f"{float(row['avg_test_acc_std'] or 0):.3f} | {float(row['avg_test_auc_mean']):.3f} | "
                f"{versus['separate']} | {versus['fedavg']} |"
            )
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(overview(Path(sys.argv[1] if len(sys.argv) > 1 else "results")))
