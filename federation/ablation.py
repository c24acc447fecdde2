"""Ablation grids and paper-style result tables (FedSAF paper 001, Sec. 4.3-4.4: Tables 4-7, Figures 4-5).

A grid is one or more *blocks*; each block is a product of setting values (``nhead=0,3,6``, ``dm=...``,
``fim=on,off``, ``split=on,off``, ``strategy=fedavg,...``, or any ``section.key``). Every combination, run once per
seed, is a *cell*: an ordinary run directory made by the same engine ``gastric-fl train`` uses
(``federation.launch.train``) under ``<out>/cells/<cell id>/``. ``<out>/ablation.json`` lists every cell with
its settings, seed, run directory and status (``data/README.md``, section 4).

Resumable: a cell whose ``summary.json`` says ``finished`` is skipped; a cell with a run directory but no finished
summary is resumed from its last checkpoint (the engine guarantees the same numbers as an uninterrupted run).

Tables, per block, with the mean and the sample standard deviation (``ddof = 1``) over seeds of each run's
figures (``federation.report``: last round averaged/std over clients, best averaged accuracy, values transmitted),
plus the worst hospital's final AUC and accuracy:

- ``components`` (Table 4: FIM x model splitting), ``distances`` (Table 5: dm), ``nhead`` (Table 6: head layers vs
  values transmitted), ``methods`` (Table 7: methods, with the worst hospital's AUC), or ``all`` columns;
- the averaged and std test accuracy over rounds (Figures 4-5), mean over seeds with a band of +- one std;
- ``paired``: each method's paired difference to Separate and to FedAvg over the seeds both finished, with the
  same value of every other grid setting (mean and a 95% t interval; ``paired_rows``, ``paired_interval``).
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.config import RunConfig, config_to_toml, load_config, read_toml
from federation.errors import FederationError
from federation.provenance import code_version, describe_code_versions
from federation.runs import SUMMARY_FILE, atomic_write_text, now_iso, read_json, write_json
from infra.outputs import OutputError, check_replaceable, claim_output, os_error_message, write_marker

ABLATION_FILE = "ablation.json"
CELLS_DIR = "cells"
TABLE_KINDS: tuple[str, ...] = ("auto", "components", "distances", "nhead", "methods", "all")

# Short grid names -> configuration keys (any "section.key" is accepted as well).
ALIASES: dict[str, str] = {
    "strategy": "strategy.name",
    "nhead": "strategy.nhead",
    "dm": "amp.dm",
    "fim": "fedsaf.fim",
    "split": "fedsaf.split",
    "alpha_k": "amp.alpha_k",
    "sigma": "amp.sigma",
    "lam": "amp.lam",
    "scale": "amp.scale",
    "mu": "fedprox.mu",
    "model": "model.name",
    "rounds": "run.rounds",
}
SHORT: dict[str, str] = {v: k for k, v in ALIASES.items()}
_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False}

TrainFn = Callable[..., Mapping[str, Any]]


# -- the grid ------------------------------------------------------------------------------------------------------
def full_key(name: str) -> str:
    """``nhead`` -> ``strategy.nhead``; ``section.key`` unchanged; anything else is an error."""
    key = ALIASES.get(name, name)
    if "." not in key:
        raise FederationError(
            f"unknown grid setting {name!r}: use one of {', '.join(ALIASES)} or a section.key such as client.lr"
        )
    return key


def parse_value(text: str) -> Any:
    """A grid value: ``on``/``off`` -> bool, TOML numbers and booleans as such, anything else a string."""
    word = text.strip()
    if word.lower() in _BOOL_WORDS:
        return _BOOL_WORDS[word.lower()]
    try:
        return tomllib.loads(f"v = {word}")["v"]
    except tomllib.TOMLDecodeError:
        return word


def parse_grid(texts: Sequence[str]) -> dict[str, list[Any]]:
    """``["nhead=0,3,6", "fim=on,off"]`` -> ``{"strategy.nhead": [0, 3, 6], "fedsaf.fim": [True, False]}``."""
    grid: dict[str, list[Any]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise FederationError(f"--grid {text!r}: write it as name=value1,value2 (e.g. --grid nhead=0,3,6)")
        key = full_key(name.strip())
        if key in grid:
            raise FederationError(f"--grid {text!r}: {name.strip()} is given twice; list all its values once")
        parsed = [parse_value(v) for v in values.split(",") if v.strip()]
        if len(set(map(repr, parsed))) != len(parsed):
            raise FederationError(f"--grid {text!r} repeats a value")
        grid[key] = parsed
    return grid


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return str(value)


def _slug(value: Any) -> str:
    text = ("on" if value else "off") if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9.]+", "", text) or "x"


@dataclass(frozen=True)
class Cell:
    """One run of the grid: its settings (full keys, in grid order) and seed."""

    params: tuple[tuple[str, Any], ...]
    seed: int
    block: int

    @property
    def id(self) -> str:
        parts = [f"{SHORT.get(k, k.replace('.', '-'))}-{_slug(v)}" for k, v in self.params]
        return "_".join([*parts, f"seed-{self.seed}"])

    @property
    def group(self) -> tuple[tuple[str, Any], ...]:
        """The settings without the seed: cells of one group are averaged over seeds."""
        return self.params

    def overrides(self) -> list[str]:
        return [f"{k}={_toml_literal(v)}" for k, v in self.params] + [f"run.seed={self.seed}"]


@dataclass
class Block:
    """One product of settings, the paper table its cells fill and (optionally) its own number of seeds."""

    grid: dict[str, list[Any]]
    table: str = "auto"
    seeds: int | None = None

    def resolved_table(self) -> str:
        if self.table != "auto":
            return self.table
        keys = {SHORT.get(k, k) for k in self.grid if len(self.grid[k]) > 1} or {SHORT.get(k, k) for k in self.grid}
        if keys and keys <= {"fim", "split"}:
            return "components"
        if keys == {"dm"}:
            return "distances"
        if "nhead" in keys:
            return "nhead"
        if keys == {"strategy"}:
            return "methods"
        return "all"


@dataclass
class Plan:
    """What ``gastric-fl ablate`` runs: a base run preset, its overrides, the blocks and the seeds.

    ``first_seed`` is the base preset's ``run.seed``; a block runs ``block.seeds`` (else ``seeds``) seeds from it.
    """

    config_path: Path
    blocks: list[Block]
    seeds: int = 1
    overrides: list[str] = field(default_factory=list)
    data: Path | None = None
    first_seed: int = 0

    def base_config(self) -> RunConfig:
        return load_config(self.config_path, self.overrides, self.data)

    def block_seeds(self, block: Block) -> list[int]:
        count = block.seeds if block.seeds is not None else self.seeds
        return [self.first_seed + i for i in range(count)]

    def block_cells(self, index: int) -> list[Cell]:
        """Block ``index``'s product x its seeds."""
        block = self.blocks[index]
        keys = list(block.grid)
        return [
            Cell(tuple(zip(keys, values, strict=True)), seed, index)
            for values in itertools.product(*(block.grid[k] for k in keys))
            for seed in self.block_seeds(block)
        ]

    def cells(self) -> list[Cell]:
        """Every block's cells; a combination listed twice (in any block) is one cell (the first)."""
        seen: set[str] = set()
        out: list[Cell] = []
        for index in range(len(self.blocks)):
            for cell in self.block_cells(index):
                if cell.id not in seen:
                    seen.add(cell.id)
                    out.append(cell)
        return out

    def cell_config(self, cell: Cell) -> RunConfig:
        return load_config(self.config_path, [*self.overrides, *cell.overrides()], self.data)

    def owners(self, cells: Sequence[Cell]) -> dict[str, str]:
        """Cell id -> id of the cell whose run it uses: cells whose resolved configurations are identical (e.g.
        ``fim=on, split=on`` and ``strategy=fedsaf`` with the defaults) share one run instead of training twice."""
        from federation.engine import resolve_config

        first: dict[str, str] = {}
        owner: dict[str, str] = {}
        for cell in cells:
            text = config_to_toml(resolve_config(self.cell_config(cell)))
            owner[cell.id] = first.setdefault(text, cell.id)
        return owner


def load_plan(
    config: Path,
    grid: Sequence[str] = (),
    seeds: int | None = None,
    overrides: Sequence[str] = (),
    table: str = "auto",
    data: Path | None = None,
) -> Plan:
    """A plan from a run preset plus ``--grid`` options, or from an ablation preset (a TOML with ``[ablation]``).

    Ablation preset::

        [ablation]
        config = "benchmark.toml"   # run preset, relative to this file
        seeds = 3
        [[ablation.block]]
        table = "components"        # optional: auto | components | distances | nhead | methods | all
        seeds = 1                   # optional: this block's own number of seeds
        fim = ["on", "off"]
        split = ["on", "off"]
    """
    if table not in TABLE_KINDS:
        raise FederationError(f"--table {table!r}: use one of {', '.join(TABLE_KINDS)}")
    raw = read_toml(config, "pass a run or ablation preset from configs/")
    seed_count = seeds
    preset_seeds: int | None = None
    if "ablation" in raw:
        if grid:
            raise FederationError(
                f"{config} is an ablation preset with its own grid: drop --grid (or use a run preset)"
            )
        section = raw["ablation"]
        unknown = set(section) - {"config", "seeds", "block"}
        if unknown:
            raise FederationError(f"{config}: unknown [ablation] keys {sorted(unknown)}; use config, seeds, block")
        if "config" not in section:
            raise FederationError(f'{config}: [ablation] needs config = "<run preset>" (relative to this file)')
        base = (config.parent / str(section["config"])).resolve()
        blocks = [_block_from_toml(b, config) for b in section.get("block", [])]
        if not blocks:
            raise FederationError(f"{config}: add at least one [[ablation.block]] with the settings to vary")
        preset_seeds = int(section.get("seeds", 1))
        if seed_count is not None:  # --seeds overrides the preset and every block
            for block in blocks:
                block.seeds = None
    else:
        if not grid:
            raise FederationError(f"{config} is a run preset: give the grid with --grid name=v1,v2 (repeatable)")
        base = config
        blocks = [Block(parse_grid(grid), table)]
    if seed_count is None:
        seed_count = preset_seeds if preset_seeds is not None else 1
    if seed_count < 1 or any(b.seeds is not None and b.seeds < 1 for b in blocks):
        raise FederationError(f"seeds must be 1 or more (got {seed_count})")
    plan = Plan(base, blocks, seed_count, list(overrides), data)
    plan.first_seed = plan.base_config().run.seed
    for cell in plan.cells():  # every cell's configuration is checked before anything runs
        try:
            plan.cell_config(cell)
        except FederationError as exc:
            raise FederationError(f"grid cell {cell.id}: {exc}") from exc
    return plan


def _block_from_toml(raw: Mapping[str, Any], source: Path) -> Block:
    table = str(raw.get("table", "auto"))
    if table not in TABLE_KINDS:
        raise FederationError(f"{source}: block table = {table!r}; use one of {', '.join(TABLE_KINDS)}")
    seeds = raw.get("seeds")
    if seeds is not None and (not isinstance(seeds, int) or isinstance(seeds, bool)):
        raise FederationError(f"{source}: block seeds = {seeds!r}; use a whole number")
    grid: dict[str, list[Any]] = {}
    for name, values in raw.items():
        if name in ("table", "seeds"):
            continue
        items = values if isinstance(values, list) else [values]
        grid[full_key(name)] = [parse_value(v) if isinstance(v, str) else v for v in items]
    if not grid:
        raise FederationError(f"{source}: an [[ablation.block]] lists no settings")
    return Block(grid, table, seeds)


# -- running -------------------------------------------------------------------------------------------------------
def _check_same_datasets(plan: Any, out: Path, runs: Sequence[Any], todo: Sequence[Any]) -> None:
    """Refuse to add cells to ``out`` when its finished cells were trained on another version of the dataset the new
    cells would use (their ``summary.json`` records the manifest's sha256): a table mixing them compares runs on
    different tiles."""
    from federation.engine.hospital import manifest_sha256

    wanted = {str(plan.cell_config(c).data.path) for c in todo}
    now = {path: manifest_sha256(Path(path)) for path in wanted}
    pending = {c.id for c in todo}
    for cell in runs:
        if cell.id in pending:
            continue
        path = str(plan.cell_config(cell).data.path)
        summary_path = out / CELLS_DIR / cell.id / SUMMARY_FILE
        if path not in now or not summary_path.is_file():
            continue
        recorded = read_json(summary_path).get("dataset_sha256")
        if recorded and recorded != now[path]:
            raise FederationError(
                f"{out}: cell {cell.id} was trained on {path} with manifest sha256 {str(recorded)[:12]}..., but that "
                f"dataset is now {now[path][:12]}...: new cells would be compared with runs on other tiles; use "
                "another --out, or restore the dataset the folder was made with"
            )


def cell_status(run_dir: Path) -> str:
    """``finished``, ``partial`` (a run directory to resume) or ``pending`` (nothing there yet)."""
    summary = run_dir / SUMMARY_FILE
    if summary.is_file():
        try:
            status = read_json(summary).get("status")
        except FederationError:
            return "partial"
        return "finished" if status == "finished" else "partial"
    return "partial" if run_dir.exists() else "pending"


def _state(
    plan: Plan, cells: Sequence[Cell], owners: Mapping[str, str], statuses: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    return {
        "version": 1,
        "config": _shown(plan.config_path),
        "overrides": plan.overrides,
        "first_seed": plan.first_seed,
        "blocks": [{"table": b.resolved_table(), "grid": b.grid, "seeds": plan.block_seeds(b)} for b in plan.blocks],
        "updated_at": now_iso(),
        "cells": [
            {
                "id": cell.id,
                "block": cell.block,
                "params": {SHORT.get(k, k): v for k, v in cell.params},
                "seed": cell.seed,
                "run_dir": f"{CELLS_DIR}/{owners[cell.id]}",
                "same_as": owners[cell.id] if owners[cell.id] != cell.id else None,
                **statuses.get(owners[cell.id], {"status": "pending", "error": None}),
            }
            for cell in cells
        ],
    }


def run_plan(
    plan: Plan,
    out: Path,
    *,
    train_fn: TrainFn | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every cell not finished yet (resuming partial ones); returns the final ``ablation.json`` content.

    Cells with identical resolved configurations share one run (``same_as`` in ``ablation.json``). A cell that
    fails with a ``FederationError`` is recorded as ``failed`` (with the error) and the grid goes on; an
    interruption is recorded and re-raised. ``train_fn`` defaults to ``federation.launch.train``.
    """
    if train_fn is None:
        from federation.launch import train

        train_fn = train
    # One ablation per folder at a time (two would run the same cells into the same run directories).
    try:
        with claim_output(out, "ablate"):
            return _run_cells(plan, out, train_fn, progress, echo)
    except OutputError as exc:
        raise FederationError(str(exc)) from None
    except OSError as exc:
        raise FederationError(os_error_message(exc, out, "--out")) from None


def _run_cells(plan: Plan, out: Path, train_fn: TrainFn, progress: bool, echo: Callable[[str], None]) -> dict[str, Any]:
    cells = plan.cells()
    owners = plan.owners(cells)
    base_text = config_to_toml(plan.base_config())
    out.mkdir(parents=True, exist_ok=True)
    marker = out / "base_config.toml"
    if marker.is_file() and marker.read_text(encoding="utf-8") != base_text:
        raise FederationError(
            f"{out} holds an ablation of another base configuration ({marker}): use another --out, or the same "
            "preset and --set options as before"
        )
    atomic_write_text(marker, base_text)
    runs = [c for c in cells if owners[c.id] == c.id]
    statuses: dict[str, dict[str, Any]] = {}
    for cell in runs:
        done = cell_status(out / CELLS_DIR / cell.id) == "finished"
        statuses[cell.id] = {"status": "finished" if done else "pending", "error": None}
    write_json(out / ABLATION_FILE, _state(plan, cells, owners, statuses))
    todo = [c for c in runs if statuses[c.id]["status"] != "finished"]
    for path in sorted({plan.cell_config(c).data.path for c in todo}):
        if not (Path(path) / "manifest.csv").is_file():
            raise FederationError(
                f"dataset {path} has no manifest.csv: make it with gastric-fl prepare (the preset's comments give "
                "the commands) or point --data at a prepared dataset"
            )
    _check_same_datasets(plan, out, runs, todo)
    shared = len(cells) - len(runs)
    echo(
        f"ablation: {len(cells)} cells ({len(runs)} runs{f', {shared} cells reuse an identical run' if shared else ''}"
        f"), {len(runs) - len(todo)} already finished, {len(todo)} to run -> {out}"
    )
    for number, cell in enumerate(todo, start=1):
        run_dir = out / CELLS_DIR / cell.id
        resume = cell_status(run_dir) == "partial" and (run_dir / "config.toml").is_file()
        echo(f"[{number}/{len(todo)}] {cell.id}{' (resuming)' if resume else ''}")
        statuses[cell.id] = {"status": "running", "error": None}
        write_json(out / ABLATION_FILE, _state(plan, cells, owners, statuses))
        try:
            train_fn(plan.cell_config(cell), run_dir, resume=resume, overwrite=not resume, progress=progress)
        except Exception as exc:
            if not getattr(exc, "user_facing", False):  # a bug: keep its traceback
                statuses[cell.id] = {"status": "failed", "error": str(exc) or type(exc).__name__}
                write_json(out / ABLATION_FILE, _state(plan, cells, owners, statuses))
                raise
            statuses[cell.id] = {"status": "failed", "error": str(exc)}
            echo(f"    failed: {exc}")
        except BaseException as exc:
            statuses[cell.id] = {"status": "stopped", "error": str(exc) or type(exc).__name__}
            write_json(out / ABLATION_FILE, _state(plan, cells, owners, statuses))
            raise
        else:
            statuses[cell.id] = {"status": "finished", "error": None}
        write_json(out / ABLATION_FILE, _state(plan, cells, owners, statuses))
    return _state(plan, cells, owners, statuses)


# -- tables ----------------------------------------------------------------------------------------------------------
# (column, source field, label) of the per-run figures averaged over seeds.
METRIC_FIELDS: tuple[tuple[str, str], ...] = (
    ("avg_train_loss", "Averaged train loss"),
    ("avg_test_acc", "Averaged test acc"),
    ("avg_test_auc", "Averaged test AUC"),
    ("std_test_acc", "Std test acc"),
    ("std_test_auc", "Std test AUC"),
    ("best_avg_test_acc", "Best averaged test acc"),
    ("worst_test_auc", "Worst hospital AUC"),
    ("worst_test_acc", "Worst hospital acc"),
    ("sent_per_round", "Values sent per round"),
    ("received_per_round", "Values received per round"),
    ("seconds_per_round", "Seconds per round"),
)
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "components": (
        "avg_train_loss",
        "avg_test_acc",
        "avg_test_auc",
        "std_test_acc",
        "std_test_auc",
        "sent_per_round",
        "received_per_round",
    ),
    "distances": ("avg_train_loss", "avg_test_acc", "std_test_acc", "avg_test_auc"),
    "nhead": ("sent_per_round", "received_per_round", "avg_test_acc", "avg_test_auc", "best_avg_test_acc"),
    "methods": (
        "best_avg_test_acc",
        "avg_test_acc",
        "avg_test_auc",
        "std_test_acc",
        "worst_test_auc",
        "worst_test_acc",
        "sent_per_round",
    ),
    "all": tuple(f for f, _ in METRIC_FIELDS),
}
TABLE_TITLES: dict[str, str] = {
    "components": "Table 4 style: FedSAF components (FIM, model splitting)",
    "distances": "Table 5 style: AMP distance metrics",
    "nhead": "Table 6 style: head layers (nhead) vs values transmitted",
    "methods": "Table 7 style: methods",
    "all": "All figures",
}
TABLE_NUMBERS: dict[str, int] = {"components": 4, "distances": 5, "nhead": 6, "methods": 7}
LABELS = dict(METRIC_FIELDS)


def run_figures(run_dir: Path) -> dict[str, Any]:
    """The figures of one finished run (``federation.report.summarise``) plus the worst hospital's final AUC/acc."""
    from federation.report import load_run, per_hospital, summarise

    run = load_run(run_dir)
    row = dict(summarise([run])[0])
    hospitals = per_hospital([run])
    aucs = [float(h["test_auc"]) for h in hospitals if h.get("test_auc") is not None]
    accs = [float(h["test_acc"]) for h in hospitals if h.get("test_acc") is not None]
    row["worst_test_auc"] = min(aucs) if aucs else None
    row["worst_test_acc"] = min(accs) if accs else None
    row["curve_avg"] = [s.avg_test_acc for s in run.rounds]
    row["curve_std"] = [s.std_test_acc for s in run.rounds]
    return row


def _mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def group_rows(cells: Sequence[Cell], figures: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per group of cells (same settings, all seeds): ``<field>_mean`` / ``<field>_std`` and ``seeds``."""
    groups: dict[tuple[tuple[str, Any], ...], list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.group, []).append(cell)
    rows: list[dict[str, Any]] = []
    for group, members in groups.items():
        done = [figures[c.id] for c in members if c.id in figures]
        row: dict[str, Any] = {SHORT.get(k, k): v for k, v in group}
        row["seeds"] = len(done)
        for name, _ in METRIC_FIELDS:
            values = [float(f[name]) for f in done if f.get(name) is not None]
            row[f"{name}_mean"], row[f"{name}_std"] = _mean_std(values)
        row["_curves"] = [(f["curve_avg"], f["curve_std"]) for f in done]
        rows.append(row)
    return rows


def _fmt(value: float | None, big: bool) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if big else f"{value:.4f}"


def markdown_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], columns: Sequence[str]) -> str:
    """A Markdown table: the settings, then ``mean ± std`` over seeds of each figure column."""
    header = [*keys, "seeds", *(LABELS[c] for c in columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        cells = [_fmt_setting(row.get(k)) for k in keys] + [str(row["seeds"])]
        for column in columns:
            big = column.endswith("_per_round") and column != "seconds_per_round"
            mean, std = row.get(f"{column}_mean"), row.get(f"{column}_std")
            text = _fmt(mean, big)
            if mean is not None and std is not None:
                text += f" ± {_fmt(std, big)}"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt_setting(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "-" if value is None else str(value)


def csv_rows(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], columns: Sequence[str]) -> str:
    from federation.report import csv_text

    fields = [*keys, "seeds", *(f"{c}_{s}" for c in columns for s in ("mean", "std"))]
    return csv_text(rows, fields)


def plot_curves(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], path: Path, title: str) -> None:
    """Averaged and std test accuracy over rounds per group (paper Fig. 4-5): mean over seeds, band of +- 1 std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_avg, ax_std) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for row in rows:
        curves = row["_curves"]
        if not curves:
            continue
        length = min(len(a) for a, _ in curves)
        if length == 0:
            continue
        label = ", ".join(f"{k}={_fmt_setting(row.get(k))}" for k in keys) or "run"
        rounds = np.arange(1, length + 1)
        for ax, index in ((ax_avg, 0), (ax_std, 1)):
            values = np.array([c[index][:length] for c in curves], dtype=float)
            mean = values.mean(axis=0)
            (line,) = ax.plot(rounds, mean, marker="o", markersize=3, label=label)
            if len(values) > 1:
                std = values.std(axis=0, ddof=1)
                ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.15)
    ax_avg.set(title="Averaged test accuracy", xlabel="round", ylabel="mean over hospitals")
    ax_std.set(title="Std test accuracy", xlabel="round", ylabel="std over hospitals")
    for ax in (ax_avg, ax_std):
        ax.grid(True, alpha=0.3)
    ax_avg.legend(fontsize=8)
    fig.suptitle(f"{title} (mean over seeds, band: +- 1 std over seeds)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- paired differences ----------------------------------------------------------------------------------------------
# The methods every other method is compared with, when the grid has them.
PAIRED_REFERENCES: tuple[str, ...] = ("separate", "fedavg")
# Per-run figures whose paired differences are reported.
PAIRED_FIELDS: tuple[str, ...] = ("avg_test_acc", "avg_test_auc", "worst_test_acc", "worst_test_auc")
# t_{0.975, df} for df = 1..30 (Student's t, two-sided 95%), to six decimals; beyond 30, scipy's value when scipy is
# installed, else the normal 1.96 (at most 0.08 too narrow at df = 31, 3% of the half-width).
T_975: tuple[float, ...] = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
    2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
    2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be 1 or more (got {df})")
    if df <= len(T_975):
        return T_975[df - 1]
    try:
        from scipy.stats import t as student_t
    except ImportError:
        return 1.96
    return float(student_t.ppf(0.975, df))


@dataclass(frozen=True)
class PairedStats:
    """Mean of paired differences, their sample std (``ddof = 1``) and 95% interval; ``None`` where undefined."""

    n: int
    mean: float | None
    sd: float | None
    low: float | None
    high: float | None


def paired_interval(differences: Sequence[float]) -> PairedStats:
    """``mean ± t_{0.975, n-1} * sd / sqrt(n)`` of ``differences`` (``sd`` with ``ddof = 1``).

    ``n = 0``: everything ``None``; ``n = 1``: the mean only (no spread, no interval).
    """
    n = len(differences)
    if n == 0:
        return PairedStats(0, None, None, None, None)
    mean = statistics.fmean(differences)
    if n == 1:
        return PairedStats(1, mean, None, None, None)
    sd = statistics.stdev(differences)
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return PairedStats(n, mean, sd, mean - half, mean + half)


def paired_text(stats: PairedStats) -> str | None:
    """``+0.100 [-0.050, +0.250]`` (three decimals; `` *`` when the interval excludes 0), the mean alone when there
    is no interval (one seed), ``None`` when there is no difference at all."""
    if stats.mean is None:
        return None
    if stats.low is None or stats.high is None:
        return f"{stats.mean:+.3f}"
    mark = " *" if stats.low > 0 or stats.high < 0 else ""
    return f"{stats.mean:+.3f} [{stats.low:+.3f}, {stats.high:+.3f}]{mark}"


def paired_differences(method: Mapping[int, float | None], reference: Mapping[int, float | None]) -> list[float]:
    """``method[s] - reference[s]`` for each seed ``s`` (ascending) where both have a value."""
    return [
        float(value) - float(ref)
        for seed, value in sorted(method.items())
        if value is not None and (ref := reference.get(seed)) is not None
    ]


def method_label(config: RunConfig, variant: Sequence[tuple[str, Any]] = ()) -> str:
    """What a paired row compares: ``fedavg``, ``fedavg+fedlws`` for a wrapped strategy, and a variant's own
    settings after it, e.g. ``depthwise_fim (reverse=true)`` or ``precision_weighted (client.optimizer=adam,
    client.lr=0.001)`` (``method_variant``)."""
    label = "+".join([config.strategy.name, *config.strategy.wrap])
    if not variant:
        return label
    shown = [
        f"{k.removeprefix(config.strategy.name + '.')}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in variant
    ]
    return f"{label} ({', '.join(shown)})"


_METHOD_KEYS = ("strategy.name", "strategy.wrap")
# The optimiser a method's paper prescribes (e.g. Adam for precision-weighted FL, paper 004).
_OPTIMIZER_KEYS = frozenset({"client.optimizer", "client.lr", "client.momentum", "client.weight_decay"})


def method_variant(plan: Plan, cell: Cell, config: RunConfig) -> tuple[tuple[str, Any], ...]:
    """The grid settings that make ``cell`` a variant of its method rather than a setting every method shares.

    A setting of the method's own section (``depthwise_fim.reverse``, ``fedsaf.fim``, a wrapper's ``fedlws.beta``)
    always is; the optimiser settings (``client.optimizer``, ``client.lr``, ...) are when a block of a single
    strategy changes the optimiser (the method's prescribed recipe, e.g. Adam for ``precision_weighted``), and
    otherwise context like any other setting (a learning-rate sweep). Paired differences compare a variant with
    the references in the context of the remaining settings. ``config``: the cell's (``plan.cell_config``).
    """
    sections = {config.strategy.name, *config.strategy.wrap}
    grid = plan.blocks[cell.block].grid
    recipe = len(grid.get("strategy.name", [None])) == 1 and "client.optimizer" in grid
    return tuple(
        (k, v)
        for k, v in cell.params
        if k not in _METHOD_KEYS and (k.split(".")[0] in sections or (recipe and k in _OPTIMIZER_KEYS))
    )


def paired_rows(
    cells: Sequence[Cell],
    figures: Mapping[str, Mapping[str, Any]],
    methods: Mapping[str, str],
    fields: Sequence[str] = PAIRED_FIELDS,
    references: Sequence[str] = PAIRED_REFERENCES,
    variants: Mapping[str, Sequence[tuple[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Paired differences of each method to each reference method of the grid.

    ``methods`` maps a cell id to its method (``method_label``); ``figures`` holds the figures of finished cells.
    Cells are paired when every other grid setting (all but ``strategy.name`` / ``strategy.wrap`` and the cell's
    ``variants``, the settings its method label carries: ``method_variant``) is the same and the seed is the same;
    a seed finished on one side only is left out. One row per setting context, reference present in that context
    and method other than the reference, with ``n`` (seeds paired) and per field
    ``<field>_diff_mean`` / ``_diff_sd`` / ``_diff_low`` / ``_diff_high`` / ``_n`` (seeds where both have the field).
    """
    # context (the other settings) -> method -> seed -> figures; the first cell of a (context, method, seed) counts
    table: dict[tuple[tuple[str, Any], ...], dict[str, dict[int, Mapping[str, Any] | None]]] = {}
    for cell in cells:
        own = {k for k, _ in (variants or {}).get(cell.id, ())}
        context = tuple(
            (k, v) for k, v in sorted(cell.params, key=lambda kv: kv[0]) if k not in _METHOD_KEYS and k not in own
        )
        seeds = table.setdefault(context, {}).setdefault(methods[cell.id], {})
        if cell.seed not in seeds:
            seeds[cell.seed] = figures.get(cell.id)
    rows: list[dict[str, Any]] = []
    for context, by_method in table.items():
        for reference in references:
            if reference not in by_method:
                continue
            ref_runs = by_method[reference]
            for method, runs in by_method.items():
                if method == reference:
                    continue
                done = {s: f for s, f in runs.items() if f is not None}
                ref_done = {s: f for s, f in ref_runs.items() if f is not None}
                row: dict[str, Any] = {SHORT.get(k, k): v for k, v in context}
                row.update(method=method, reference=reference, n=len(done.keys() & ref_done.keys()))
                for name in fields:
                    diffs = paired_differences(
                        {s: f.get(name) for s, f in done.items()}, {s: f.get(name) for s, f in ref_done.items()}
                    )
                    stats = paired_interval(diffs)
                    row[f"{name}_diff_mean"], row[f"{name}_diff_sd"] = stats.mean, stats.sd
                    row[f"{name}_diff_low"], row[f"{name}_diff_high"] = stats.low, stats.high
                    row[f"{name}_n"] = stats.n
                rows.append(row)
    return rows


def _fmt_diff(row: Mapping[str, Any], name: str) -> str:
    mean = row.get(f"{name}_diff_mean")
    if mean is None:
        return "-"
    low, high = row.get(f"{name}_diff_low"), row.get(f"{name}_diff_high")
    text = f"{mean:+.4f} " + (f"[{low:+.4f}, {high:+.4f}]" if low is not None and high is not None else "[n/a]")
    if row.get(f"{name}_n") != row.get("n"):
        text += f" (n={row.get(f'{name}_n')})"
    return text


def paired_context_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The grid settings (other than the method) that appear in ``rows``, in order of appearance."""
    keys: list[str] = []
    for row in rows:
        for key in row:
            if key == "method":  # the settings come first
                break
            if key not in keys:
                keys.append(key)
    return keys


def paired_markdown(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] = PAIRED_FIELDS) -> str:
    """A Markdown table: the other settings, method, reference, n, then ``mean [95% interval]`` per field."""
    keys = paired_context_keys(rows)
    header = [*keys, "method", "minus", "n", *(f"Δ {LABELS[f]} [95% CI]" for f in fields)]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        cells = [_fmt_setting(row.get(k)) for k in keys] + [str(row["method"]), str(row["reference"]), str(row["n"])]
        cells += [_fmt_diff(row, f) for f in fields]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_csv(rows: Sequence[Mapping[str, Any]], fields: Sequence[str] = PAIRED_FIELDS) -> str:
    from federation.report import csv_text

    parts = ("diff_mean", "diff_sd", "diff_low", "diff_high", "n")
    columns = [*paired_context_keys(rows), "method", "reference", "n", *(f"{f}_{p}" for f in fields for p in parts)]
    return csv_text(rows, columns)


PAIRED_NOTE = (
    "Paired differences: for each method and each reference method (Separate, FedAvg) in the grid, with the same "
    "value of every other grid setting, d_s = figure(method, seed s) - figure(reference, seed s) over the n seeds "
    "both finished; mean [mean ± t_{0.975, n-1} · sd / √n] with sd the sample std (ddof = 1) of the d_s. n = 1 has "
    "no interval (n/a). An interval that excludes 0 means the difference is unlikely to be seed noise alone. "
    "(n=k) after a figure: only k seeds have it (e.g. a hospital without AUC).\n"
)


def write_tables(plan: Plan, out: Path, *, per_run_reports: bool = True) -> dict[str, Path]:
    """Write the paper-style tables (Markdown + CSV) and curves, one per table kind, and ``results.md``.

    Files: ``table4_components``, ``table5_distances``, ``table6_nhead``, ``table7_methods`` (or ``table_all``)
    with ``.md``, ``.csv`` and ``.png``; ``paired.md`` / ``paired.csv`` when the grid has Separate or FedAvg and
    another method (``paired_rows``; key ``paired`` of the result); each finished run also gets
    ``federation.report``'s own report in ``<run>/report/``.
    """
    from federation.report import load_run, write_report

    cells = plan.cells()
    owners = plan.owners(cells)
    by_run: dict[str, dict[str, Any]] = {}
    figures: dict[str, dict[str, Any]] = {}
    for cell in cells:
        owner = owners[cell.id]
        run_dir = out / CELLS_DIR / owner
        if owner not in by_run:
            if cell_status(run_dir) != "finished":
                continue
            by_run[owner] = run_figures(run_dir)
            if per_run_reports and not (run_dir / "report" / "report.md").is_file():
                write_report([load_run(run_dir)], run_dir / "report")
        figures[cell.id] = by_run[owner]
    paths: dict[str, Path] = {}
    sections = [
        "# Ablation results\n",
        f"Base preset `{_shown(plan.config_path)}`"
        + (f" with {' '.join('--set ' + o for o in plan.overrides)}" if plan.overrides else "")
        + f"; seeds from {plan.first_seed}. Each figure: mean ± sample std (ddof=1) over the seeds that finished, "
        "of the run's last round (averaged/std = mean/std over hospitals of each hospital's own test split); best = "
        "highest averaged accuracy over rounds; worst hospital = lowest final AUC/accuracy among hospitals; "
        "values = tensor values per round, all hospitals together (server -> clients = sent, clients -> server "
        "= received), counted from the messages.\n",
    ]
    kinds: dict[str, list[int]] = {}
    for index, block in enumerate(plan.blocks):
        kinds.setdefault(block.resolved_table(), []).append(index)
    for kind in sorted(kinds, key=lambda k: list(TABLE_TITLES).index(k)):
        # Blocks of one kind make one table (e.g. Table 6: FedAvg and FedAMP at nhead 0 beside FedSAF's nheads).
        table_cells: list[Cell] = []
        keys: list[str] = []
        for index in kinds[kind]:
            table_cells += plan.block_cells(index)
            keys += [SHORT.get(k, k) for k in plan.blocks[index].grid if SHORT.get(k, k) not in keys]
        rows = group_rows(table_cells, figures)
        columns = TABLE_COLUMNS[kind]
        stem = f"table{TABLE_NUMBERS[kind]}_{kind}" if kind in TABLE_NUMBERS else f"table_{kind}"
        md, csv_path, png = out / f"{stem}.md", out / f"{stem}.csv", out / f"{stem}.png"
        table = markdown_rows(rows, keys, columns)
        atomic_write_text(md, f"# {TABLE_TITLES[kind]}\n\n{table}\n![curves]({png.name})\n")
        atomic_write_text(csv_path, csv_rows(rows, keys, columns))
        plot_curves(rows, keys, png, TABLE_TITLES[kind])
        paths[stem] = md
        missing = len(table_cells) - sum(1 for c in table_cells if c.id in figures)
        note = f" ({missing} of {len(table_cells)} runs not finished: left out)" if missing else ""
        sections += [f"\n## {TABLE_TITLES[kind]}{note}\n", table, f"\n![curves]({png.name})\n"]
    configs = {cell.id: plan.cell_config(cell) for cell in cells}
    variants = {cell.id: method_variant(plan, cell, configs[cell.id]) for cell in cells}
    methods = {cell.id: method_label(configs[cell.id], variants[cell.id]) for cell in cells}
    paired = paired_rows(cells, figures, methods, variants=variants)
    if paired:
        table = paired_markdown(paired)
        title = "Paired differences to Separate and FedAvg (same seeds)"
        atomic_write_text(out / "paired.md", f"# {title}\n\n{PAIRED_NOTE}\n{table}")
        atomic_write_text(out / "paired.csv", paired_csv(paired))
        paths["paired"] = out / "paired.md"
        sections += [f"\n## {title}\n", PAIRED_NOTE, table]
    results = out / "results.md"
    atomic_write_text(results, "\n".join(sections))
    paths["results"] = results
    return paths


# -- publishing ----------------------------------------------------------------------------------------------------
# What recomputes every table of an ablation: per run, its configuration and per-round records (no weights).
PUBLISHED_RUN_FILES = ("config.toml", "summary.json", "metrics.jsonl", "aggregation.jsonl")
VERSIONS_FILE = "versions.txt"
COMMAND_FILE = "COMMAND.md"


def installed_versions(code: str) -> str:
    """Python, the platform, the code (``code_version()``) and every installed distribution as ``name==version``,
    one per line, sorted."""
    import platform
    import sys
    from importlib import metadata

    names = {f"{dist.metadata['Name']}=={dist.version}" for dist in metadata.distributions() if dist.metadata["Name"]}
    head = [f"python {sys.version.split()[0]}", f"platform {platform.platform()}", f"code {code}"]
    return "\n".join([*head, *sorted(names, key=str.lower)]) + "\n"


def publish(plan: Plan, out: Path, dest: Path, command: str, rebuild: str | None = None) -> list[Path]:
    """Copy an ablation's tables and the small raw files behind them to ``dest`` (e.g. ``docs/results/NAME``).

    Per finished run: ``PUBLISHED_RUN_FILES`` (no checkpoints, weights or predictions); per ablation:
    ``ablation.json``, ``base_config.toml`` and every table, figure and ``paired`` file ``write_tables`` wrote; plus
    ``versions.txt`` (``installed_versions``) and ``COMMAND.md`` (the command, and how to rebuild the tables
    from the copy alone: ``gastric-fl ablate --config PRESET --out DEST --tables-only``). ``dest`` is claimed like
    any output folder (``infra.outputs.claim_output``), so only a folder this command wrote is replaced.
    Returns the files written.
    """
    import shutil

    if not (out / "base_config.toml").is_file():
        raise FederationError(f"{out} holds no ablation (no base_config.toml): run gastric-fl ablate first")
    command_name = "ablate --publish"
    written: list[Path] = []
    try:
        with claim_output(dest, command_name, flag="--publish"):
            check_replaceable(dest, command_name, flag="--publish")
            staging = dest.with_name(f".{dest.name}.publishing")
            if staging.exists():
                shutil.rmtree(staging)  # our own leftover from an interrupted publish (the lock is ours)
            staging.mkdir(parents=True)
            for path in sorted(out.iterdir()):
                if path.is_file() and path.suffix in (".md", ".csv", ".png", ".json", ".toml"):
                    shutil.copy2(path, staging / path.name)
                    written.append(dest / path.name)
            # the preset as the publishing command names it (relative to the working folder), not the path of the
            # folder the runs were trained from
            if (staging / ABLATION_FILE).is_file():
                state = read_json(staging / ABLATION_FILE)
                state["config"] = _shown(plan.config_path)
                write_json(staging / ABLATION_FILE, state)
            owners = plan.owners(plan.cells())
            trained_at: dict[str, list[str]] = {}  # the commits that trained each run (summary.json)
            for run_id in sorted(set(owners.values())):
                run_dir = out / CELLS_DIR / run_id
                if cell_status(run_dir) != "finished":
                    continue
                (staging / CELLS_DIR / run_id).mkdir(parents=True)
                for name in PUBLISHED_RUN_FILES:
                    if (run_dir / name).is_file():
                        shutil.copy2(run_dir / name, staging / CELLS_DIR / run_id / name)
                        written.append(dest / CELLS_DIR / run_id / name)
                versions = read_json(run_dir / SUMMARY_FILE).get("code_versions") or ["not recorded"]
                trained_at.setdefault(" then ".join(f"`{v}`" for v in versions), []).append(run_id)
            published_at = code_version()
            (staging / VERSIONS_FILE).write_text(installed_versions(published_at), encoding="utf-8")
            if rebuild is None:
                rebuild = f"gastric-fl ablate --config {_shown(plan.config_path)} --out {_shown(dest)} --tables-only"
            (staging / COMMAND_FILE).write_text(
                "# How these tables were made\n\n"
                f"```bash\n{command}\n```\n\n"
                f"Published at git commit `{published_at}`. {describe_code_versions(trained_at)} "
                f"Package versions: [{VERSIONS_FILE}]({VERSIONS_FILE}). "
                "Each run's `config.toml`, `summary.json`, "
                f"`metrics.jsonl` and `aggregation.jsonl` are under `{CELLS_DIR}/`; the tables are rebuilt from them "
                f"alone (no training) by\n\n```bash\n{rebuild}\n```\n",
                encoding="utf-8",
            )
            written += [dest / VERSIONS_FILE, dest / COMMAND_FILE]
            write_marker(staging, command_name)
            old = dest.with_name(f".{dest.name}.replaced")
            if dest.exists():
                dest.rename(old)
            staging.rename(dest)
            if old.exists():
                shutil.rmtree(old)
    except OutputError as exc:
        raise FederationError(str(exc)) from None
    except OSError as exc:
        raise FederationError(os_error_message(exc, dest, "--publish")) from None
    return written


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it (a command others can paste), else as is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
