"""The Compare page's figures: the paper-style table of several runs (FedSAF paper Tables 4-7) and ablation
grids (``gastric-fl ablate``: ``<ablation>/ablation.json`` + ``cells/<cell id>/`` run folders) with their
nhead x dm heatmap (Tables 5-6).

The per-run figures come from ``federation.report`` (the code behind ``gastric-fl report``), so the dashboard and
the CLI print the same numbers: averaged and std (population, over clients) test accuracy and AUC at the last
round, the best averaged accuracy over rounds, values per round in each direction and seconds per round. The
dashboard adds the best averaged AUC over rounds, the total values transmitted and the run's wall seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from app.dashboard.errors import DashboardError
from app.dashboard.runs import config_value, load_config, load_metrics, run_seconds

ABLATION_FILE = "ablation.json"

# federation.report field (or one added here) -> column shown.
FIGURES: dict[str, str] = {
    "avg_test_acc": "Averaged ACC",
    "std_test_acc": "Std ACC",
    "best_avg_test_acc": "Best ACC",
    "avg_test_auc": "Averaged AUC",
    "std_test_auc": "Std AUC",
    "best_avg_test_auc": "Best AUC",
    "values_total": "Values transmitted",
    "sent_per_round": "Sent / round",
    "received_per_round": "Received / round",
    "seconds_total": "Seconds",
    "seconds_per_round": "Seconds / round",
}
ID_COLUMNS = ("run", "algorithm", "nhead", "dm", "status", "rounds")


def figures(run: Path) -> dict[str, Any]:
    """One run's figures: ``federation.report.summarise`` plus best AUC, total values and wall seconds."""
    from federation.report import load_run, summarise

    result = load_run(run)
    row: dict[str, Any] = dict(summarise([result])[0])
    aucs = [s.avg_test_auc for s in result.rounds if s.avg_test_auc is not None]
    row["best_avg_test_auc"] = max(aucs) if aucs else None
    row["values_total"] = sum(s.values_sent + s.values_received for s in result.rounds)
    row["seconds_total"] = run_seconds(run, load_metrics(run))
    return row


def _resolved_nhead(config: dict[str, Any]) -> int | None:
    nhead = config_value(config, "strategy", "nhead")
    if nhead is not None:
        return int(nhead)
    name = config_value(config, "strategy", "name")
    if not isinstance(name, str):
        return None
    from app.dashboard.settings import default_nhead  # the strategy's own default when the config leaves it out

    return default_nhead(name)


def compare_table(runs: Iterable[tuple[str, Path]]) -> pd.DataFrame:
    """The paper-style table, one row per ``(label, run folder)``; a run without results keeps empty figures."""
    rows = []
    for label, path in runs:
        config = load_config(path)
        row: dict[str, Any] = {
            "run": label,
            "algorithm": config_value(config, "strategy", "name"),
            "nhead": _resolved_nhead(config),
            "dm": config_value(config, "amp", "dm"),
        }
        try:
            found = figures(path)
        except ValueError:  # FederationError: not a run folder (yet)
            found = {"status": "unknown", "rounds": 0}
        row["status"] = found.get("status")
        row["rounds"] = found.get("rounds")
        row.update({name: found.get(key) for key, name in FIGURES.items()})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*ID_COLUMNS, *FIGURES.values()])
    numeric = list(FIGURES.values())
    frame[numeric] = frame[numeric].apply(pd.to_numeric, errors="coerce")
    return frame


# --- ablation grids -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridCell:
    """One cell of an ablation grid: its settings (short names such as ``nhead``, ``dm``), seed and run folder."""

    cell_id: str
    params: dict[str, Any]
    seed: int | None
    run_dir: Path
    status: str
    error: str | None


@dataclass(frozen=True)
class Grid:
    """An ablation folder written by ``gastric-fl ablate``."""

    name: str
    path: Path
    cells: list[GridCell]

    def runs(self) -> list[tuple[str, Path]]:
        """Distinct run folders (cells with identical settings share one), labelled by cell id."""
        seen: dict[Path, str] = {}
        for cell in self.cells:
            seen.setdefault(cell.run_dir, cell.cell_id)
        return [(label, path) for path, label in seen.items()]

    def varied(self) -> list[str]:
        """The settings that take more than one value across the grid's cells (the table's first columns)."""
        keys: dict[str, set[str]] = {}
        for cell in self.cells:
            for key, value in cell.params.items():
                keys.setdefault(key, set()).add(json.dumps(value))
        return [k for k, values in keys.items() if len(values) > 1]


def load_grid(folder: Path) -> Grid:
    """Read ``ablation.json``; a one-line ``DashboardError`` names the file when it is not readable."""
    path = folder / ABLATION_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DashboardError(f"{path} cannot be read ({exc}); re-run gastric-fl ablate to rewrite it") from exc
    cells = []
    for item in data.get("cells", []) if isinstance(data, dict) else []:
        if not isinstance(item, dict) or "id" not in item or "run_dir" not in item:
            raise DashboardError(f"{path}: every cell needs an id and a run_dir")
        params = item.get("params") if isinstance(item.get("params"), dict) else {}
        seed = item.get("seed")
        cells.append(
            GridCell(
                cell_id=str(item["id"]),
                params=dict(params or {}),
                seed=int(seed) if isinstance(seed, int) else None,
                run_dir=folder / str(item["run_dir"]),
                status=str(item.get("status", "pending")),
                error=str(item["error"]) if item.get("error") else None,
            )
        )
    return Grid(folder.name, folder, cells)


def list_grids(ablations: Path) -> list[Grid]:
    """Ablation folders under ``ablations`` (by name); unreadable ones are skipped here and reported on load."""
    if not ablations.is_dir():
        return []
    return [load_grid(p) for p in sorted(ablations.iterdir()) if (p / ABLATION_FILE).is_file()]


def grid_table(grid: Grid) -> pd.DataFrame:
    """The paper-style table of a grid: its varied settings and seed first, then each distinct run's figures."""
    table = compare_table(grid.runs())
    by_label = {cell.cell_id: cell for cell in grid.cells}
    varied = grid.varied()
    for key in varied:
        if key not in table.columns:  # nhead and dm are already there, read from each run's config
            table[key] = [_text(by_label[label].params.get(key)) for label in table["run"]]
    table["seed"] = [by_label[label].seed for label in table["run"]]
    front = ["run", *varied, "seed"]
    return table[front + [c for c in table.columns if c not in front]]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def grid_heatmap(table: pd.DataFrame, figure: str) -> pd.DataFrame:
    """nhead (rows) x dm (columns) of one figure column, averaged over seeds and any other varied setting.

    Empty when the table does not vary nhead or dm (nothing to lay out on a grid).
    """
    usable = table.dropna(subset=["nhead", "dm", figure])
    if usable.empty or (usable["nhead"].nunique() < 2 and usable["dm"].nunique() < 2):
        return pd.DataFrame()
    usable = usable.assign(nhead=usable["nhead"].astype(int))
    return usable.pivot_table(index="nhead", columns="dm", values=figure, aggfunc="mean").sort_index()


def curves(runs: Sequence[tuple[str, Path]], column: str = "acc_mean") -> dict[str, pd.Series]:
    """Averaged curve (``runs.per_round`` column) of each run, by label, for the overlaid chart."""
    from app.dashboard.runs import per_round

    found: dict[str, pd.Series] = {}
    for label, path in runs:
        rounds = per_round(load_metrics(path)).set_index("round")
        if not rounds.empty:
            found[label] = rounds[column]
    return found
