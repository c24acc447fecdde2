"""The Compare page's figures: the paper-style table of several runs (FedSAF paper Tables 4-7) and ablation
grids (``gastric-fl ablate``: ``<ablation>/ablation.json`` + ``cells/<cell id>/`` run folders) with their
nhead x dm heatmap (Tables 5-6).

The per-run figures come from ``federation.report.all_figures`` (the code behind ``gastric-fl report`` and the
ablation tables), so the dashboard and the CLI print the same numbers: averaged and std (population, over clients)
test accuracy and AUC at the last round, the best averaged accuracy and AUC over rounds, values per round in each
direction, the total values transmitted and seconds per round. The dashboard adds the run's wall seconds.

Before comparing, the page says what could make the comparison say little: the settings that differ between the
runs (`settings_diff`, from each run's resolved ``config.toml``) and runs of other lengths or on other data
(`mismatches`). The ablation launcher's batches (``jobs.QueueEntry``) are laid out as grids too (`queue_grids`),
and `example_ablate` writes a ``gastric-fl ablate`` command that runs as shown on the data at hand.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from app.errors import DashboardError
from app.run_records import (
    config_error,
    config_value,
    load_metrics,
    load_summary,
    read_run_config,
    run_dataset,
    run_problem,
    run_seconds,
)
from federation.ablation import ABLATION_FILE, shown_path
from federation.runfiles import CONFIG_FILE
from infra.formats import MANIFEST_FILE

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
DAMAGED = "damaged"  # the status of a run with a damaged file (`app.run_records.run_problem`)
ID_COLUMNS = ("run", "algorithm", "nhead", "dm", "status", "rounds")


def figures(run: Path) -> dict[str, Any]:
    """One run's figures: ``federation.report.all_figures`` (the ``summarise`` row, best AUC, total values...) plus
    the run's wall seconds (`app.run_records.run_seconds`)."""
    from federation.report import all_figures, load_run

    row = all_figures(load_run(run))
    row["seconds_total"] = run_seconds(run, load_metrics(run))
    return row


def _resolved_nhead(config: dict[str, Any]) -> int | None:
    nhead = config_value(config, "strategy", "nhead")
    if nhead is not None:
        return int(nhead)
    name = config_value(config, "strategy", "name")
    if not isinstance(name, str):
        return None
    from federation.methods import default_nhead  # the strategy's own default when the config leaves it out

    return default_nhead(name)


def compare_table(runs: Iterable[tuple[str, Path]]) -> pd.DataFrame:
    """The paper-style table, one row per ``(label, run folder)``; a run without results (or with a damaged
    ``config.toml``: `read_config` names it) keeps empty figures."""
    rows = []
    for label, path in runs:
        config = read_config(path)[0]
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
        # A run with a damaged file is "damaged" (its readable lines are still compared), not "failed".
        row["status"] = DAMAGED if run_problem(path) else found.get("status") or "unknown"
        row["rounds"] = found.get("rounds")
        row.update({name: found.get(key) for key, name in FIGURES.items()})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*ID_COLUMNS, *FIGURES.values()])
    numeric = list(FIGURES.values())
    frame[numeric] = frame[numeric].apply(pd.to_numeric, errors="coerce")
    # A setting a run does not have (dm without FedAMP, say) reads "—", never "None"; figures stay numeric (NaN
    # shows as an empty cell).
    for column in ("algorithm", "dm", "status"):
        frame[column] = frame[column].map(lambda v: MISSING if v is None or v != v else v).astype(object)
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
    """Averaged curve (``runs.per_round`` column) of each run, by label, for the overlaid chart; a run whose
    ``metrics.jsonl`` cannot be read is left out (the page names the file)."""
    from app.run_records import per_round

    found: dict[str, pd.Series] = {}
    for label, path in runs:
        try:
            rounds = per_round(load_metrics(path)).set_index("round")
        except DashboardError:
            continue
        if not rounds.empty:
            found[label] = rounds[column]
    return found


# --- what differs between runs ------------------------------------------------------------------------------------

MISSING = "—"  # a setting one run's config.toml does not have


def read_config(run: Path) -> tuple[dict[str, Any], str | None]:
    """A run's ``config.toml`` and, when it cannot be used, one line naming it and what to do (then ``{}``).

    A run that has not started yet has no ``config.toml``: ``{}`` and no problem.
    """
    problem = config_error(run)
    if problem is not None:
        first = problem.splitlines()[0]
        return {}, f"{first}: left out of the settings diff; restore the file or delete the run folder"
    return read_run_config(run), None


def flatten(config: Mapping[str, Any]) -> dict[str, Any]:
    """``{section: {key: value}}`` as ``{"section.key": value}`` (the ``--set`` names of ``federation.config``)."""
    flat: dict[str, Any] = {}
    for section, values in config.items():
        if isinstance(values, Mapping):
            flat.update({f"{section}.{key}": value for key, value in values.items()})
        else:
            flat[section] = values
    return flat


def _cell(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class SettingsDiff:
    """Every setting whose value differs between the runs that could be read (rows: ``section.key``; columns: the
    runs' labels; ``—``: the run's config.toml lacks the setting), and one line per run left out."""

    table: pd.DataFrame
    problems: list[str]
    compared: list[str]


def settings_diff(runs: Sequence[tuple[str, Path]]) -> SettingsDiff:
    """The settings diff of ``(label, run folder)`` pairs, from each run's resolved ``config.toml``; ``data.path``
    compared as the folder it names (`app.run_records.run_dataset`), so a relative and an absolute path to the
    same dataset do not differ."""
    configs: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for label, path in runs:
        config, problem = read_config(path)
        if problem:
            problems.append(problem)
        elif not config:
            problems.append(f"{path / CONFIG_FILE} does not exist yet: run {label} has not started")
        else:
            flat = flatten(config)
            if "data.path" in flat:  # one run's relative path and another's absolute one name the same folder
                resolved = run_dataset(config, path)
                flat["data.path"] = str(resolved) if resolved is not None else flat["data.path"]
            configs[label] = flat
    keys = sorted({key for flat in configs.values() for key in flat})
    rows = []
    for key in keys:
        shown = {label: _cell(flat.get(key)) for label, flat in configs.items()}
        if len(set(shown.values())) > 1:
            rows.append({"setting": key, **shown})
    table = pd.DataFrame(rows, columns=["setting", *configs])
    return SettingsDiff(table, problems, list(configs))


def _rounds_done(run: Path, summary: Mapping[str, Any]) -> int | None:
    done = summary.get("rounds_done")
    if isinstance(done, int) and not isinstance(done, bool):
        return done
    try:
        metrics = load_metrics(run)
    except DashboardError:
        return None
    return int(metrics["round"].max()) if not metrics.empty else 0


def _listing(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{label}: {value}" for label, value in values.items())


def mismatches(runs: Sequence[tuple[str, Path]]) -> list[str]:
    """Why the figures of these runs may not be comparable, one sentence each: different numbers of rounds
    (planned in ``run.rounds`` or done so far) and different data (``data.path``, or the sha256 of the dataset's
    ``manifest.csv`` recorded in ``summary.json`` as ``dataset_sha256``)."""
    planned: dict[str, Any] = {}
    done: dict[str, Any] = {}
    paths: dict[str, str] = {}
    hashes: dict[str, str] = {}
    for label, path in runs:
        config = read_config(path)[0]
        summary = load_summary(path)
        rounds = config_value(config, "run", "rounds") or summary.get("total_rounds")
        if isinstance(rounds, int) and not isinstance(rounds, bool):
            planned[label] = rounds
        finished = _rounds_done(path, summary)
        if finished is not None:
            done[label] = finished
        data = config_value(config, "data", "path") or summary.get("dataset")
        if isinstance(data, str) and data:
            paths[label] = data
        digest = summary.get("dataset_sha256")
        if isinstance(digest, str) and digest:
            hashes[label] = digest
    found: list[str] = []
    if len(set(planned.values())) > 1:
        found.append(
            f"These runs were set up for different numbers of rounds ({_listing(planned)}): their last-round and "
            "best figures are not comparable; compare runs of the same length, or read the curves round by round."
        )
    elif len(set(done.values())) > 1:
        found.append(
            f"These runs completed different numbers of rounds ({_listing(done)}): their last-round figures come "
            "from different rounds; compare runs that completed the same number, or read the curves round by round."
        )
    known = len(hashes) == len(runs) and len(runs) > 1
    if known and len(set(hashes.values())) > 1:
        short = {label: f"{digest[:12]}…" for label, digest in hashes.items()}
        found.append(
            f"These runs trained on different data: the sha256 of the dataset's {MANIFEST_FILE} differs "
            f"({_listing(short)}). Each hospital's figures come from other tiles, so the comparison says little "
            "about the methods."
        )
    elif not known and len(set(paths.values())) > 1:
        found.append(
            f"These runs trained on different datasets ({_listing(paths)}). Each hospital's figures come from "
            "other tiles, so the comparison says little about the methods."
        )
    return found


# --- the example command and the launcher's grids -----------------------------------------------------------------


def example_ablate(root: Path, datasets: Sequence[Path], run_datasets: Sequence[Path | None]) -> str:
    """A ``gastric-fl ablate`` command that runs as shown: on the dataset of the newest run that still exists,
    else on the first prepared dataset, else on the demo dataset, preceded by the commands that make it."""
    from app.dashboard.commands import DEMO_NAME, demo_commands
    from app.dashboard.presets import PRESETS_DIR

    existing = [d for d in (*run_datasets, *datasets) if d is not None and (d / MANIFEST_FILE).is_file()]
    lines: list[str] = []
    if existing:
        dataset = existing[0]
    else:
        lines += [shlex.join(command) for command in demo_commands(root, ["gastric-fl"])]
        dataset = root / "prepared" / DEMO_NAME
    command = ["gastric-fl", "ablate", "--config", shown_path(PRESETS_DIR / "demo.toml")]
    command += ["--grid", "nhead=0,3,6", "--grid", "dm=manhattan,euclidean", "--set", "strategy.name=fedsaf"]
    command += ["--data", str(dataset), "--out", str(root / "ablations" / f"{dataset.name}-nhead-dm")]
    lines.append(shlex.join(command))
    return "\n".join(lines)


def queue_grids(entries: Sequence[Any], runs_root: Path) -> list[Grid]:
    """The ablation launcher's batches (``jobs.QueueEntry`` with ``params`` such as nhead, dm, seed) as grids, so
    the grid view lays them out like a ``gastric-fl ablate`` folder; a cell's status is its run's."""
    batches: dict[str, list[GridCell]] = {}
    for entry in entries:
        if entry.cancelled:
            continue
        params = {k: v for k, v in entry.params.items() if k != "seed"}
        seed = entry.params.get("seed")
        run_dir = Path(entry.target)
        summary = load_summary(run_dir)
        status = str(summary.get("status") or ("pending" if not entry.started else "running"))
        error = summary.get("error")
        batches.setdefault(entry.batch, []).append(
            GridCell(
                entry.entry_id,
                params,
                int(seed) if isinstance(seed, int) else None,
                run_dir,
                status,
                str(error) if error else None,
            )
        )
    return [Grid(name, runs_root / name, cells) for name, cells in batches.items()]
