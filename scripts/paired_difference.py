"""Paired difference of two methods or cells of a published ablation folder over the seeds both finished.

``gastric-fl ablate`` pairs every method with Separate and FedAvg (``paired.md``); this pairs any two methods run
with their plain settings in one grid, e.g. FedSAF against FedAMP over 5 seeds, or any two cells named by their id
without the seed (e.g. a Table 6 ``nhead`` against FedSAF's defaults), from the published run files alone (each
run's figures as ``federation.ablation.run_figures`` reads them, the interval and the minimum detectable difference
at 80% power of ``paired_interval``):

    .venv/bin/python scripts/paired_difference.py results/methods_site_shift fedsaf fedamp
    .venv/bin/python scripts/paired_difference.py results/tables456_seed_like \
        strategy-fedsaf_nhead-12 strategy-fedsaf_fim-on_split-on
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from federation.ablation import (
    PairedStats,
    cells_folder,
    paired_differences,
    paired_interval,
    paired_text,
    run_figures,
)

FIELDS = ("avg_test_acc", "avg_test_auc")


def plain_runs(folder: Path, method: str, runs_root: Path | None = None) -> dict[int, Path]:
    """Seed -> run folder of the finished cells of ``folder`` that set nothing but ``strategy = method``, or whose
    id without its ``_seed-N`` is ``method``; the run folders under ``runs_root`` (default ``folder``: where
    ``cells/`` is, or where its ``cells.tar.xz`` was unpacked)."""
    cells = json.loads((folder / "ablation.json").read_text(encoding="utf-8"))["cells"]
    runs: dict[int, Path] = {}
    for cell in cells:
        chosen = cell["params"] == {"strategy": method} or cell.get("id", "").rsplit("_seed-", 1)[0] == method
        if chosen and cell["status"] == "finished":
            runs.setdefault(int(cell["seed"]), (runs_root or folder) / cell["run_dir"])
    return runs


def pair(
    folder: Path, method: str, reference: str, figures: Callable[[Path], Mapping[str, Any]] = run_figures
) -> dict[str, PairedStats]:
    """Per field, ``method - reference`` over the seeds both finished (``paired_interval``)."""
    with cells_folder(folder) as cells:  # the folder's cells.tar.xz, or cells/ where unpacked
        runs = {name: plain_runs(folder, name, cells.parent) for name in (method, reference)}
        for name, found in runs.items():
            if not found:
                raise SystemExit(
                    f"{folder}: no finished run of {name!r} (a method with plain settings, or a cell id without its "
                    "seed)"
                )
        values = {name: {seed: figures(path) for seed, path in found.items()} for name, found in runs.items()}
    return {
        field: paired_interval(
            paired_differences(
                {s: f.get(field) for s, f in values[method].items()},
                {s: f.get(field) for s, f in values[reference].items()},
            )
        )
        for field in FIELDS
    }


def describe(stats: PairedStats) -> str:
    text = paired_text(stats)
    return "n/a" if text is None else f"{text} (n={stats.n})"


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(
            "usage: paired_difference.py FOLDER METHOD REFERENCE (methods, or cell ids without _seed-N)",
            file=sys.stderr,
        )
        return 2
    folder, method, reference = Path(argv[0]), argv[1], argv[2]
    if not (folder / "ablation.json").is_file():
        print(f"{folder} holds no ablation.json: give a published ablation folder", file=sys.stderr)
        return 2
    for field, stats in pair(folder, method, reference).items():
        print(f"{folder.name}: {method} - {reference}, {field}: {describe(stats)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
