"""``gastric-fl ablate --workers N`` (issue 32): cells run in N processes at once give the sequential grid's figures,
and a parallel grid that was interrupted resumes to the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.checks import every
from support.tiny_dataset import TINY_SETTINGS

from federation.ablation import ABLATION_FILE, load_plan, run_plan
from federation.launch import train

GRID = ("client.lr=0.01,0.03",)


def _preset(tmp_path: Path, dataset: Path) -> Path:
    path = tmp_path / "preset.toml"
    path.write_text(f'[run]\nname = "w"\n[data]\npath = "{dataset.as_posix()}"\n', encoding="utf-8")
    return path


def _figures(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every cell's ``metrics.jsonl`` without its timings, by cell."""
    found = {}
    for metrics in sorted((out / "cells").glob("*/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines()]
        found[metrics.parent.name] = [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]
    return found


def interrupting_train(config: Any, run_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """The engine's train, except that the cell of lr 0.03 is interrupted (Ctrl-C) before its run starts and the
    other after its run has ended (a worker stopped with its cell's run written, not yet reported). The first waits
    until the other has started: a cell that reaches its worker after the grid was interrupted is not started at
    all (federation.ablation.cells.train_cell), and a loaded machine can start the two workers seconds apart."""
    import time

    started = run_dir.parent / "lr-0.01.started"
    if "lr-0.03" in run_dir.name:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        raise KeyboardInterrupt
    started.parent.mkdir(parents=True, exist_ok=True)
    started.write_text("", encoding="utf-8")
    train(config, run_dir, **kwargs)
    raise KeyboardInterrupt


def test_parallel_cells_give_the_sequential_figures_and_an_interrupted_grid_resumes(
    dataset: Path, tmp_path: Path
) -> None:
    plan = load_plan(_preset(tmp_path, dataset), GRID, overrides=TINY_SETTINGS)
    lines: list[str] = []
    sequential = run_plan(plan, tmp_path / "sequential", progress=False, echo=lines.append)
    assert [c["status"] for c in sequential["cells"]] == ["finished", "finished"]
    expected = _figures(tmp_path / "sequential")
    assert len(expected) == 2
    assert every(len(rows) >= 4 for rows in expected.values())  # 2 rounds x 2 hospitals at least

    # an interrupted parallel grid: one cell stopped before its run, the other with its run written
    out = tmp_path / "parallel"
    parallel: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_plan(plan, out, train_fn=interrupting_train, progress=False, echo=parallel.append, workers=2)
    assert "2 cells over 2 worker processes" in parallel
    recorded = {c["id"]: c["status"] for c in json.loads((out / ABLATION_FILE).read_text())["cells"]}
    assert recorded == {"client-lr-0.01_seed-0": "finished", "client-lr-0.03_seed-0": "stopped"}

    # the same command resumes: the stopped cell runs, the finished one is kept, the figures are the sequential's
    # (with one cell left the grid runs it in this process; a fresh grid runs both cells in 2 workers at once)
    resumed: list[str] = []
    final = run_plan(plan, out, progress=False, echo=resumed.append, workers=2)
    assert [c["status"] for c in final["cells"]] == ["finished", "finished"]
    assert any("1 already finished, 1 to run" in line for line in resumed)
    assert _figures(out) == expected


def test_workers_must_be_at_least_one(dataset: Path, tmp_path: Path) -> None:
    from federation.errors import FederationError

    plan = load_plan(_preset(tmp_path, dataset), GRID, overrides=TINY_SETTINGS)
    with pytest.raises(FederationError, match="--workers 0: give at least 1"):
        run_plan(plan, tmp_path / "none", progress=False, echo=lambda _: None, workers=0)


def waiting_train(config: Any, run_dir: Path, **kwargs: Any) -> dict[str, Any]:
    """A cell that says it started (a file beside its run directory) and then waits to be cancelled."""
    import time

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    (run_dir.parent / f"{run_dir.name}.started").write_text("", encoding="utf-8")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.1)
    raise AssertionError("the cell was not cancelled")


def test_an_interrupted_ray_grid_cancels_its_cells_and_resumes(dataset: Path, tmp_path: Path) -> None:
    """``--ray local``: a Ray cluster started for the grid runs the cells as tasks, two at once. Ctrl-C while they
    run: every task in flight is cancelled and waited for, the cells are recorded as stopped, the cluster is
    stopped; the same command then finishes the grid on a new cluster with the sequential grid's figures, cell by
    cell, and stops that cluster too."""
    import os
    import signal
    import threading
    import time

    import ray

    plan = load_plan(_preset(tmp_path, dataset), GRID, overrides=TINY_SETTINGS)
    out = tmp_path / "ray"

    def interrupt_when_both_started() -> None:
        deadline = time.monotonic() + 120
        while len(list((out / "cells").glob("*.started"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: a real signal wakes the main thread's wait

    # Ctrl-C as a command line gets it: Python's own handler (an earlier test's library may have installed another)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = threading.Thread(target=interrupt_when_both_started, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_plan(plan, out, train_fn=waiting_train, progress=False, echo=lambda _: None, ray="local", workers=2)
    finally:
        watcher.join(timeout=5)
        signal.signal(signal.SIGINT, previous)
    assert len(list((out / "cells").glob("*.started"))) == 2
    recorded = {c["id"]: c["status"] for c in json.loads((out / ABLATION_FILE).read_text())["cells"]}
    assert recorded == {"client-lr-0.01_seed-0": "stopped", "client-lr-0.03_seed-0": "stopped"}
    assert not ray.is_initialized()

    lines: list[str] = []
    final = run_plan(plan, out, progress=False, echo=lines.append, ray="local", workers=2)
    assert [c["status"] for c in final["cells"]] == ["finished", "finished"]
    assert any(line.startswith("2 cells over Ray tasks on local (2 CPUs, 0 GPUs)") for line in lines)
    assert not ray.is_initialized()
    run_plan(plan, tmp_path / "sequential", progress=False, echo=lambda _: None)
    expected = _figures(tmp_path / "sequential")
    assert len(expected) == 2
    assert _figures(out) == expected


def test_an_unreachable_ray_address_is_one_line(dataset: Path, tmp_path: Path) -> None:
    import socket

    from federation.errors import FederationError

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    plan = load_plan(_preset(tmp_path, dataset), GRID, overrides=TINY_SETTINGS)
    with pytest.raises(FederationError, match=rf"--ray 127.0.0.1:{port}: no Ray cluster answers there"):
        run_plan(plan, tmp_path / "none", progress=False, echo=lambda _: None, ray=f"127.0.0.1:{port}")
    recorded = json.loads((tmp_path / "none" / ABLATION_FILE).read_text())["cells"]
    assert [c["status"] for c in recorded] == ["pending", "pending"]
