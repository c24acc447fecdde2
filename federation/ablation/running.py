"""Running an ablation plan into its folder (``data/README.md``, section 4).

Every cell is an ordinary run directory made by the same engine ``gastric-fl train`` uses
(``federation.launch.train``) under ``<out>/cells/<cell id>/``; ``<out>/ablation.json`` lists every cell with its
settings, seed, run directory and status. Resumable: a cell whose ``summary.json`` says ``finished`` is skipped; a
cell with a run directory but no finished summary is resumed from its last checkpoint (the engine guarantees the
same numbers as an uninterrupted run). Also the folder's names (`ABLATION_FILE`, `CELLS_DIR`) and how a path is
written in the commands and files an ablation records (`shown_path`).

``workers`` > 1 runs that many cells at once in worker processes, and ``ray`` sends the cells to a Ray cluster
(`federation.ablation.cells` says where and how each runs); the cells' figures are those of the sequential grid
(each cell is its own seeded run). Only this process writes ``ablation.json``. An interruption (Ctrl-C reaches
every worker, and Ray cells are cancelled: each stops its run cleanly) records the running cells as stopped; the
same command resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any

from federation.ablation.cells import TrainFn, cause, process_cells, ray_cells, visible_gpus
from federation.ablation.grid import SHORT, Cell, Plan
from federation.config import RunConfig, config_to_toml
from federation.errors import FederationError
from federation.runfiles import CONFIG_FILE, SUMMARY_FILE
from federation.runs import atomic_write_text, now_iso, write_json
from federation.summary_errors import read_summary_object
from infra.formats import MANIFEST_FILE
from infra.outputs import OutputError, claim_output, os_error_message

ABLATION_FILE = "ablation.json"
CELLS_DIR = "cells"


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
    from infra.formats import manifest_sha256

    wanted = {str(plan.cell_config(c).data.path) for c in todo}
    now = {path: manifest_sha256(Path(path)) for path in wanted}
    pending = {c.id for c in todo}
    for cell in runs:
        if cell.id in pending:
            continue
        path = str(plan.cell_config(cell).data.path)
        run_dir = out / CELLS_DIR / cell.id
        if path not in now or not (run_dir / SUMMARY_FILE).is_file():
            continue
        recorded = read_summary_object(run_dir).get("dataset_sha256")
        if recorded and recorded != now[path]:
            raise FederationError(
                f"{out}: cell {cell.id} was trained on {path} with manifest sha256 {str(recorded)[:12]}..., but that "
                f"dataset is now {now[path][:12]}...: new cells would be compared with runs on other tiles; use "
                "another --out, or restore the dataset the folder was made with"
            )


def cell_status(run_dir: Path) -> str:
    """``finished``, ``partial`` (a run directory to resume) or ``pending`` (nothing there yet)."""
    if (run_dir / SUMMARY_FILE).is_file():
        try:
            status = read_summary_object(run_dir).get("status")
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
    workers: int | None = None,
    ray: str | None = None,
) -> dict[str, Any]:
    """Run every cell not finished yet (resuming partial ones); returns the final ``ablation.json`` content.
    ``workers``: cells at once (module docstring; None: 1 here, and with ``ray`` as many as the cluster places);
    ``ray``: a Ray cluster's address. With either, ``train_fn`` must be a module-level function.

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
            return _run_cells(plan, out, train_fn, progress, echo, workers, ray)
    except OutputError as exc:
        raise FederationError(str(exc)) from None
    except OSError as exc:
        raise FederationError(os_error_message(exc, out, "--out")) from None


def _run_cells(
    plan: Plan,
    out: Path,
    train_fn: TrainFn,
    progress: bool,
    echo: Callable[[str], None],
    workers: int | None = None,
    ray: str | None = None,
) -> dict[str, Any]:
    if workers is not None and workers < 1:
        raise FederationError(f"--workers {workers}: give at least 1 (cells run at once)")
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
        if not (Path(path) / MANIFEST_FILE).is_file():
            raise FederationError(
                f"dataset {path} has no {MANIFEST_FILE}: make it with gastric-fl prepare (the preset's comments give "
                "the commands) or point --data at a prepared dataset"
            )
    _check_same_datasets(plan, out, runs, todo)
    shared = len(cells) - len(runs)
    echo(
        f"ablation: {len(cells)} cells ({len(runs)} runs{f', {shared} cells reuse an identical run' if shared else ''}"
        f"), {len(runs) - len(todo)} already finished, {len(todo)} to run -> {out}"
    )

    def save() -> None:
        write_json(out / ABLATION_FILE, _state(plan, cells, owners, statuses))

    if (ray is not None and todo) or ((workers or 1) > 1 and len(todo) > 1):
        _run_parallel(plan, out, todo, statuses, save, train_fn, echo, workers, ray)
        return _state(plan, cells, owners, statuses)
    for number, cell in enumerate(todo, start=1):
        run_dir = out / CELLS_DIR / cell.id
        resume = cell_status(run_dir) == "partial" and (run_dir / CONFIG_FILE).is_file()
        echo(f"[{number}/{len(todo)}] {cell.id}{' (resuming)' if resume else ''}")
        statuses[cell.id] = {"status": "running", "error": None}
        save()
        try:
            train_fn(plan.cell_config(cell), run_dir, resume=resume, overwrite=not resume, progress=progress)
        except Exception as exc:
            _record_failure(cell.id, exc, statuses, save, echo)
        except BaseException as exc:
            statuses[cell.id] = {"status": "stopped", "error": str(exc) or type(exc).__name__}
            save()
            raise
        else:
            statuses[cell.id] = {"status": "finished", "error": None}
        save()
    return _state(plan, cells, owners, statuses)


def _record_failure(
    cell_id: str,
    exc: Exception,
    statuses: dict[str, dict[str, Any]],
    save: Callable[[], None],
    echo: Callable[[str], None],
) -> None:
    """A cell's failure: a user-facing error is recorded and the grid goes on; anything else (a bug) is recorded
    and re-raised with its traceback."""
    statuses[cell_id] = {"status": "failed", "error": str(exc) or type(exc).__name__}
    if not getattr(exc, "user_facing", False):
        save()
        raise exc
    echo(f"    failed: {exc}")


def check_cells_fit(configs: Sequence[RunConfig], at_once: int) -> None:
    """Refuse ``at_once`` of the cells of ``configs`` sharing one GPU when their estimated memory exceeds its free
    memory (`federation.hospital.gpu_memory.check_cells`); nothing for the cells that set ``run.check_gpu_memory =
    false``
    (none checked when all do)."""
    configs = [c for c in configs if c.run.check_gpu_memory]
    if not configs:
        return
    from federation.hospital import gpu_memory

    counts = {path: gpu_memory.hospital_tiles(path) for path in {str(c.data.path) for c in configs}}
    needs = [gpu_memory.config_bytes(c, counts[str(c.data.path)]) for c in configs]
    gpu_memory.check_cells(needs, at_once, gpu_memory.free_gpu_bytes())


def _run_parallel(
    plan: Plan,
    out: Path,
    todo: Sequence[Cell],
    statuses: dict[str, dict[str, Any]],
    save: Callable[[], None],
    train_fn: TrainFn,
    echo: Callable[[str], None],
    workers: int | None,
    ray: str | None,
) -> None:
    """``todo`` in worker processes or on a Ray cluster (`federation.ablation.cells`), at most ``workers`` cells in
    flight (None: all of them, Ray's scheduler placing them); one line per cell started and finished, counting over
    the whole grid."""
    configs = [plan.cell_config(c) for c in todo]
    on_gpu = any(c.run.device in ("cuda", "auto") for c in configs)
    limit = len(todo) if workers is None else min(workers, len(todo))
    if ray is None and limit > 1 and len(visible_gpus(on_gpu)) == 1:  # the cells in flight share one GPU
        check_cells_fit(configs, limit)
    pool = ray_cells(ray, on_gpu, workers) if ray is not None else process_cells(limit, on_gpu)
    waiting = list(todo)
    done = 0
    try:
        with pool as (submit, where):
            echo(f"{len(todo)} cells over {where}" + ("" if limit == len(todo) else f", {limit} at once"))
            running: dict[Future[None], Cell] = {}
            while waiting or running:
                while waiting and len(running) < limit:
                    cell = waiting.pop(0)
                    run_dir = out / CELLS_DIR / cell.id
                    resume = cell_status(run_dir) == "partial" and (run_dir / CONFIG_FILE).is_file()
                    running[submit(train_fn, plan.cell_config(cell), run_dir, resume)] = cell
                    statuses[cell.id] = {"status": "running", "error": None}
                save()
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    cell = running.pop(future)
                    done += 1
                    try:
                        future.result()
                    except Exception as exc:
                        _record_failure(cell.id, cause(exc), statuses, save, echo)
                    else:
                        statuses[cell.id] = {"status": "finished", "error": None}
                    echo(f"[{done}/{len(todo)}] {cell.id}: {statuses[cell.id]['status']}")
            save()
    except BaseException as exc:  # an interruption: the pool has let its running cells end; record where each is
        for cell in todo:
            if statuses[cell.id]["status"] in ("finished", "failed"):
                continue
            was_running = statuses[cell.id]["status"] == "running"
            now = cell_status(out / CELLS_DIR / cell.id)
            if now == "finished":
                statuses[cell.id] = {"status": "finished", "error": None}
            elif was_running or now == "partial":
                statuses[cell.id] = {"status": "stopped", "error": str(exc) or type(exc).__name__}
            else:
                statuses[cell.id] = {"status": "pending", "error": None}
        save()
        raise
