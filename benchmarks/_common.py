"""What the benchmark scripts share: the command that ran them, the machine line, writing the report, the check that
a folder holds an ablation's cells, mean ± sd; and, for the
ones that time whole rounds, a synthetic dataset made once (`synthetic_dataset`) and a timed run (`round_seconds`)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from federation.ablation.archive import CELLS_ARCHIVE

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "app.cli"]


def command_line(script: str) -> str:
    """``benchmarks/<script>`` with this process's arguments, as typed from the repository root."""
    return " ".join([".venv/bin/python", f"benchmarks/{script}", *sys.argv[1:]])


def machine() -> str:
    """``Machine: <architecture>, <n> CPU cores visible (load average ...)``, the start of a report's machine line.

    The load average (1 / 5 / 15 min, when the report is written) says whether other work shared the cores.
    """
    load = os.getloadavg()
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores visible "
        f"(load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} when written)"
    )


def device_line(device: str) -> str:
    """``<machine()>; device <device> (<its GPU's name, or "none (CPU run)">); torch <version>.``: the machine line of
    a report that ran on ``device``."""
    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "none (CPU run)"
    return f"{machine()}; device {device} ({name}); torch {torch.__version__}."


def write_result(path: Path, text: str) -> None:
    """Write a report to ``path``, creating its folder when needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def mean_sd(values: Sequence[float], digits: int) -> str:
    """``mean ± sd`` of ``values`` to ``digits`` decimals (sd with ddof 1; 0 for one value), ``-`` for none."""
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}f} ± {sd:.{digits}f}"


def ablation_folder_problem(folder: Path) -> str | None:
    """The one-line error for a folder that holds neither an ablation's ``cells/`` nor a published
    ``cells.tar.xz``; ``None`` when it holds one of them."""
    if (folder / "cells").is_dir() or (folder / CELLS_ARCHIVE).is_file():
        return None
    return f"error: {folder} holds no cells/ folder: give the --out folder of gastric-fl ablate"


def emit_report(title: str, script: str, lines: Sequence[str], out: Path | None) -> str:
    """A markdown report: ``# title``, the command that made it (`command_line`), then ``lines``; printed, and
    written to ``out`` when given (`write_result`). Returns the text."""
    text = "\n".join([f"# {title}", "", f"Command: `{command_line(script)}`", "", *lines, ""])
    print(text)
    if out is not None:
        write_result(out, text)
    return text


def _timed(args: Sequence[str]) -> float:
    """Run a ``gastric-fl`` command from the repository root; its wall seconds."""
    start = time.perf_counter()
    subprocess.run([*CLI, *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def synthetic_dataset(
    fmt: str, slides: int, work: Path, prepare_preset: str, workers: int = 1
) -> tuple[Path, dict[str, float]]:
    """``gastric-fl synth --format fmt --images slides --seed 0 --difficulty 0.3`` into ``work/raw``, then
    ``gastric-fl prepare --config prepare_preset`` into ``work/prepared`` (both with ``--workers``), each only when
    its output is not there yet: (the prepared folder, each stage's wall seconds when it ran, kept in
    ``work/times.json`` for later calls)."""
    raw, prepared, record = work / "raw", work / "prepared", work / "times.json"
    times: dict[str, float] = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
    if "synth" not in times or not raw.is_dir():
        times["synth"] = _timed(
            ["synth", "--format", fmt, "--images", str(slides), "--seed", "0", "--difficulty", "0.3",
             "--workers", str(workers), "--out", str(raw), "--overwrite"]
        )  # fmt: skip
        times.pop("prepare", None)
    if "prepare" not in times or not (prepared / "manifest.csv").is_file():
        times["prepare"] = _timed(
            ["prepare", "--config", prepare_preset, "--input", str(raw), "--out", str(prepared),
             "--workers", str(workers), "--overwrite", "--no-progress"]
        )  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(times, indent=1), encoding="utf-8")
    return prepared, times


def round_seconds(
    preset: Path, data: Path, settings: Sequence[str], rounds: int, run_dir: Path
) -> tuple[list[float], float]:
    """Train ``preset`` with ``settings`` for ``rounds`` rounds on ``data`` into ``run_dir`` (removed afterwards):
    (each round's ``seconds`` from ``aggregation.jsonl``: train, aggregate and evaluate every hospital; the whole
    run's wall seconds, start-up included)."""
    from federation.config import load_config
    from federation.launch import train

    config = load_config(preset, [f"run.rounds={rounds}", *settings], data)
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        start = time.perf_counter()
        train(config, run_dir, progress=False)
        total = time.perf_counter() - start
        lines = (run_dir / "aggregation.jsonl").read_text(encoding="utf-8").splitlines()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return [float(json.loads(line)["seconds"]) for line in lines], total
