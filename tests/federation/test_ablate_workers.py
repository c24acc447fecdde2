"""``gastric-fl ablate --workers N`` (issue 32): cells run in N processes at once give the sequential grid's figures,
and a parallel grid that was interrupted resumes to the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.tiny_dataset import TINY_SETTINGS

from federation.ablation import ABLATION_FILE, load_plan, run_plan
from federation.launch import train

GRID = ("client.lr=0.01,0.03",)
INTERRUPTED = "lr-0.03"  # the cell whose worker is interrupted


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
    """The engine's train, except that one cell's worker is interrupted (Ctrl-C) before its run starts."""
    if INTERRUPTED in run_dir.name:
        raise KeyboardInterrupt
    return train(config, run_dir, **kwargs)


def test_parallel_cells_give_the_sequential_figures_and_an_interrupted_grid_resumes(
    dataset: Path, tmp_path: Path
) -> None:
    plan = load_plan(_preset(tmp_path, dataset), GRID, overrides=TINY_SETTINGS)
    lines: list[str] = []
    sequential = run_plan(plan, tmp_path / "sequential", progress=False, echo=lines.append)
    assert [c["status"] for c in sequential["cells"]] == ["finished", "finished"]
    expected = _figures(tmp_path / "sequential")
    assert len(expected) == 2
    assert all(len(rows) >= 4 for rows in expected.values())  # 2 rounds x 2 hospitals at least

    parallel: list[str] = []
    state = run_plan(plan, tmp_path / "parallel", progress=False, echo=parallel.append, workers=2)
    assert [c["status"] for c in state["cells"]] == ["finished", "finished"]
    assert "2 cells over 2 worker processes" in parallel
    assert sorted(line.split("] ")[0] for line in parallel if line.startswith("[")) == ["[1/2", "[2/2"]
    assert _figures(tmp_path / "parallel") == expected

    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        run_plan(plan, out, train_fn=interrupting_train, progress=False, echo=lambda _: None, workers=2)
    recorded = {c["id"]: c["status"] for c in json.loads((out / ABLATION_FILE).read_text())["cells"]}
    stopped = [cell for cell, status in recorded.items() if status == "stopped"]
    assert len(stopped) == 1
    assert INTERRUPTED in stopped[0]
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
