"""Running an ablation plan into its folder (``data/README.md``, section 4).

Every cell is an ordinary run directory made by the same engine ``gastric-fl train`` uses
(``federation.launch.train``) under ``<out>/cells/<cell id>/``; ``<out>/ablation.json`` lists every cell with its
settings, seed, run directory and status. Resumable: a cell whose ``summary.json`` says ``finished`` is skipped; a
cell with a run directory but no finished summary is resumed from its last checkpoint (the engine guarantees the
same numbers as an uninterrupted run). Also the folder's names (`ABLATION_FILE`, `CELLS_DIR`) and how a path is
written in the commands and files an ablation records (`shown_path`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from federation.ablation.grid import SHORT, Cell, Plan
from federation.config import config_to_toml
from federation.errors import FederationError
from federation.runfiles import CONFIG_FILE, SUMMARY_FILE
from federation.runs import atomic_write_text, now_iso, read_json, write_json
from infra.outputs import OutputError, claim_output, os_error_message

ABLATION_FILE = "ablation.json"
CELLS_DIR = "cells"

TrainFn = Callable[..., Mapping[str, Any]]


def shown_path(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it (a command others can paste), else as is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


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
        "config": shown_path(plan.config_path),
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
        resume = cell_status(run_dir) == "partial" and (run_dir / CONFIG_FILE).is_file()
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
