"""The accuracy-against-epsilon table of scripts/privacy_tradeoff.sh, from the published runs alone (no training).

Reads every published ablation under the folder given (``<folder>/<arm>/ablation.json`` and each cell's
``config.toml`` and ``metrics.jsonl``), and writes ``<folder>/results.md`` and ``<folder>/results.csv``:

* per method and epsilon (none, 8, 3, 1): the last round's averaged test accuracy and AUC over hospitals, mean over
  seeds, and each hospital's epsilon as it reported it (the largest of the three);
* paired differences over the same seeds (`federation.ablation.paired_interval`: mean, 95% t interval and minimum
  detectable difference at 80% power): each DP
  cell against the same method without DP, and against Separate without DP (the floor a hospital has alone).

    .venv/bin/python scripts/privacy_table.py results/privacy
"""

from __future__ import annotations

import csv
import io
import json
import sys
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.ablation import (  # noqa: E402
    PairedStats,
    cells_folder,
    paired_differences,
    paired_interval,
    paired_text,
)
from federation.report import load_run, summarise  # noqa: E402

METHODS = ("fedsaf", "fedrep", "fedavg")
LEVELS = (None, 8.0, 3.0, 1.0)  # target epsilons; None: no DP


def _cells(folder: Path) -> list[dict[str, Any]]:
    """Every finished cell of every published ablation under ``folder``: method, target epsilon, seed, figures
    (each ablation's runs read from its ``cells.tar.xz``, or ``cells/`` where unpacked)."""
    found = []
    for record_path in sorted(folder.glob("*/ablation.json")):
        with cells_folder(record_path.parent) as cells:
            found += _finished(record_path, cells.parent)
    return found


def _finished(record_path: Path, runs: Path) -> list[dict[str, Any]]:
    """The finished cells of the ablation ``record_path`` lists, their run folders under ``runs``."""
    found = []
    record = json.loads(record_path.read_text(encoding="utf-8"))
    for cell in record["cells"]:
        run = runs / cell["run_dir"]
        if cell.get("status") != "finished" or not (run / "metrics.jsonl").is_file():
            continue
        config = tomllib.loads((run / "config.toml").read_text(encoding="utf-8"))
        row = summarise([load_run(run)])[0]
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        last = max(line["round"] for line in lines)
        epsilons = [line["dp_epsilon"] for line in lines if line["round"] == last and "dp_epsilon" in line]
        found.append(
            {
                "method": config["strategy"]["name"],
                "epsilon": max(epsilons) if epsilons else None,
                "noise_multiplier": (config.get("privacy") or {}).get("noise_multiplier"),
                "seed": int(config["run"]["seed"]),
                "acc": row["avg_test_acc"],
                "auc": row["avg_test_auc"],
                "cell": f"{record_path.parent.name}/{cell['run_dir']}",
            }
        )
    return found


def _level(epsilon: float | None) -> float | None:
    """The target epsilon a measured one belongs to (the runs reach their target to within the accountant's
    rounding); ``None`` for no DP."""
    if epsilon is None:
        return None
    return min((t for t in LEVELS if t is not None), key=lambda t: abs(t - epsilon))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _diff(stats: PairedStats) -> str:
    return paired_text(stats) or "—"


def build(folder: Path) -> str:
    """The results as Markdown (and ``results.csv`` beside it); see the module docstring."""
    cells = _cells(folder)
    by: dict[tuple[str, float | None], dict[int, dict[str, Any]]] = defaultdict(dict)
    for cell in cells:
        by[(cell["method"], _level(cell["epsilon"]))][cell["seed"]] = cell
    separate = by.get(("separate", None), {})
    lines = [
        "| method | epsilon (target) | epsilon reported (max over hospitals) | seeds | accuracy | AUC "
        "| accuracy − same method without DP | accuracy − Separate without DP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for name, runs in (("separate", separate),):
        accs = [c["acc"] for c in runs.values()]
        aucs = [c["auc"] for c in runs.values()]
        lines.append(
            f"| {name} | no DP | — | {len(runs)} | {_fmt(sum(accs) / len(accs) if accs else None)} | "
            f"{_fmt(sum(aucs) / len(aucs) if aucs else None)} | — | — |"
        )
    for method in METHODS:
        plain = by.get((method, None), {})
        for level in LEVELS:
            runs = by.get((method, level), {})
            if not runs:
                continue
            accs = [c["acc"] for c in runs.values()]
            aucs = [c["auc"] for c in runs.values()]
            eps = [c["epsilon"] for c in runs.values() if c["epsilon"] is not None]
            acc = {s: c["acc"] for s, c in runs.items()}
            vs_plain = paired_interval(paired_differences(acc, {s: c["acc"] for s, c in plain.items()}))
            vs_separate = paired_interval(paired_differences(acc, {s: c["acc"] for s, c in separate.items()}))
            lines.append(
                f"| {method} | {'no DP' if level is None else f'{level:g}'} | {_fmt(max(eps) if eps else None, 2)} | "
                f"{len(runs)} | {_fmt(sum(accs) / len(accs))} | {_fmt(sum(aucs) / len(aucs))} | "
                f"{'—' if level is None else _diff(vs_plain)} | {_diff(vs_separate)} |"
            )
            rows.append(
                {
                    "method": method,
                    "epsilon_target": "" if level is None else level,
                    "epsilon_reported_max": "" if not eps else max(eps),
                    "seeds": len(runs),
                    "accuracy": sum(accs) / len(accs),
                    "auc": sum(aucs) / len(aucs),
                    "acc_minus_no_dp": "" if level is None or vs_plain.mean is None else vs_plain.mean,
                    "acc_minus_separate": "" if vs_separate.mean is None else vs_separate.mean,
                }
            )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["method"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (folder / "results.csv").write_text(buffer.getvalue(), encoding="utf-8")
    return "\n".join(lines) + "\n"


def main() -> None:
    folder = (Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results" / "privacy").resolve()
    table = build(folder)
    shown = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
    text = (
        "# Accuracy against epsilon\n\n"
        "Made by `bash scripts/privacy_tradeoff.sh` (its header says what it runs); rebuilt from the published runs "
        f"alone by `.venv/bin/python scripts/privacy_table.py {shown}`. "
        "Last round's averaged test accuracy and AUC over the 3 hospitals, mean over seeds; differences are paired "
        "over the same seeds, mean and 95% t interval (`*`: the interval excludes 0) and (MDD m) the smallest true "
        "difference these seeds find with 80% power at alpha 0.05. Epsilon at delta 1e-5, one "
        "slide the protected unit.\n\n" + table
    )
    (folder / "results.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
