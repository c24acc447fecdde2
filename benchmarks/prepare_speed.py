"""Tiles per second of `gastric-fl prepare` on BOT-size (2048x2048) TIFF slides, beside the floor no pipeline beats.

The FedSAF paper's BOT slides are 2048x2048 TIFF (paper 001, Table 2). This script writes a few synthetic ones
(`pipeline.synth.generate_dataset`, zlib-compressed like a scanner export), then measures in one run:

- **floor**: read each TIFF, decode it with tifffile and slice it into tiles with NumPy (copies), nothing else;
- **prepare (full)**: `prepare_dataset` end to end (check every slide, SVG masks, extraction, white filter,
  PNG encoding, manifest/report), with 1 and 2 worker threads;
- **tiling stage**: the per-slide work of the second pass alone, with 2 threads and with 2 processes (the
  alternative we did not pick), to show which parallelism suits decoding/tiling here.

Rates are tiles per second: ``grid`` counts every grid position examined (comparable with the floor, which
slices all of them); ``kept`` counts tiles that passed the white filter and were written.
Results are printed and written to benchmarks/results/prepare_speed.md with the command that reproduces them.

    .venv/bin/python benchmarks/prepare_speed.py --slides 8 --tile 256
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config import PrepareConfig, build_config  # noqa: E402
from pipeline.prepare import _Job, _tile_job, prepare_dataset  # noqa: E402
from pipeline.sources import discover, inspect_slide  # noqa: E402
from pipeline.synth import generate_dataset  # noqa: E402
from pipeline.tiling import client_plans  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "prepare_speed.md"


@dataclass(frozen=True)
class _ForkState:
    jobs: list[_Job]
    config: PrepareConfig
    staging: Path


# Set before the process pool forks, so a worker receives only an integer (no objects are serialised).
_STATE: list[_ForkState] = []


def floor_one(path: Path, tile: int) -> int:
    """Bare cost: read + tifffile decode + NumPy slicing into contiguous tiles."""
    image = tifffile.imread(io.BytesIO(path.read_bytes()))
    height, width = image.shape[:2]
    count = 0
    for y in range(0, height - tile + 1, tile):
        for x in range(0, width - tile + 1, tile):
            np.ascontiguousarray(image[y : y + tile, x : x + tile])
            count += 1
    return count


def _process_tile(index: int) -> int:
    state = _STATE[0]
    return len(_tile_job(state.jobs[index], state.config, state.staging).rows)


def timed(func: Callable[[], int], repeats: int, setup: Callable[[], None] | None = None) -> tuple[float, int]:
    """Best wall time of ``repeats`` runs (least disturbed by the other users of a shared machine)."""
    best = float("inf")
    result = 0
    for _ in range(repeats):
        if setup is not None:
            setup()  # not timed
        start = time.perf_counter()
        result = func()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slides", type=int, default=8, help="number of 2048x2048 BOT slides")
    parser.add_argument("--tile", type=int, default=256, help="tile px (BOT preset: 256)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant; the best is reported")
    parser.add_argument("--workdir", type=Path, default=None, help="keep generated slides here (default: temp)")
    parser.add_argument("--no-write", action="store_true", help="print only, do not update the results file")
    args = parser.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    raw = work / "raw"
    if not (raw / "synth.json").is_file():
        print(f"generating {args.slides} BOT slides (2048x2048) in {raw} ...", flush=True)
        generate_dataset(raw, "bot", images=args.slides, seed=0, abnormal_fraction=0.5)
    slides = sorted(raw.rglob("*.tiff"))
    tile = args.tile
    grid_per_slide = (2048 // tile) ** 2
    grid_total = grid_per_slide * len(slides)

    def config(workers: int, out: Path) -> PrepareConfig:
        return build_config(
            None,
            {
                "source": {"format": "bot", "input": raw},
                "split": {"clients": 2, "sizes": "equal"},
                "tiles": {"tile": tile},
                "output": {"out": out, "workers": workers},
            },
        )

    rows: list[tuple[str, float, int, int]] = []

    def record(name: str, seconds: float, grid: int, kept: int) -> None:
        rows.append((name, seconds, grid, kept))
        print(
            f"{name:<48} {seconds:7.2f} s  {grid / seconds:8.0f} grid tiles/s  {kept / seconds:8.0f} kept/s", flush=True
        )

    def floor(workers: int) -> Callable[[], int]:
        def run() -> int:
            with ThreadPoolExecutor(workers) as pool:
                return sum(pool.map(lambda path: floor_one(path, tile), slides))

        return run

    def full(workers: int, out: Path) -> tuple[Callable[[], int], Callable[[], None]]:
        def run() -> int:
            return prepare_dataset(config(workers, out)).tiles

        def clean() -> None:
            shutil.rmtree(out, ignore_errors=True)

        return run, clean

    for workers in (1, 2):
        seconds, count = timed(floor(workers), args.repeats)
        record(f"floor: tifffile decode + NumPy slicing, {workers} thread(s)", seconds, count, count)

    for workers in (1, 2):
        run, clean = full(workers, work / f"prepared-{workers}")
        seconds, kept = timed(run, args.repeats, setup=clean)
        record(f"prepare_dataset (full), {workers} thread(s)", seconds, grid_total, kept)

    # Second pass alone (decode + mask + extraction + filter + PNG encode + write), threads vs processes.
    cfg = config(2, work / "unused")
    infos = [inspect_slide(ref, cfg.source, raw) for ref in discover(cfg.source)]
    plan = client_plans(cfg)[0]
    jobs = [_Job(info, 0, "train", plan) for info in infos]
    staging = work / "staging"

    def fresh_staging() -> None:
        shutil.rmtree(staging, ignore_errors=True)
        for label in ("normal", "abnormal"):
            (staging / "client_00" / "train" / label).mkdir(parents=True)

    def threads() -> int:
        with ThreadPoolExecutor(2) as pool:
            return sum(pool.map(lambda job: len(_tile_job(job, cfg, staging).rows), jobs))

    _STATE.append(_ForkState(jobs=jobs, config=cfg, staging=staging))

    def processes() -> int:
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
            return sum(pool.map(_process_tile, range(len(jobs))))

    seconds, kept = timed(threads, args.repeats, setup=fresh_staging)
    record("tiling stage only, 2 threads (used)", seconds, grid_total, kept)
    seconds, kept = timed(processes, args.repeats, setup=fresh_staging)
    record("tiling stage only, 2 processes (fork)", seconds, grid_total, kept)

    by_name = {name: (seconds, grid, kept) for name, seconds, grid, kept in rows}
    floor2 = by_name["floor: tifffile decode + NumPy slicing, 2 thread(s)"]
    full1 = by_name["prepare_dataset (full), 1 thread(s)"]
    full2 = by_name["prepare_dataset (full), 2 thread(s)"]
    thr = by_name["tiling stage only, 2 threads (used)"]
    proc = by_name["tiling stage only, 2 processes (fork)"]
    ratios = [
        f"- full prepare, 2 threads vs the 2-thread floor: {full2[0] / floor2[0]:.1f}x the floor's time "
        f"({grid_total / full2[0]:.0f} vs {grid_total / floor2[0]:.0f} grid tiles/s)",
        f"- full prepare, 2 threads vs 1 thread: {full1[0] / full2[0]:.2f}x faster",
        f"- tiling stage, threads vs processes: threads take {thr[0] / proc[0]:.2f}x the processes' time",
    ]
    print("\n".join(ratios))

    if args.no_write:
        return
    command = "python benchmarks/prepare_speed.py " + " ".join(sys.argv[1:])
    lines = [
        "# prepare speed: BOT-size slides",
        "",
        f"Reproduce: `.venv/bin/{command.strip()}`",
        "",
        f"{len(slides)} synthetic BOT slides, 2048x2048 RGB TIFF (zlib), {tile} px tiles "
        f"({grid_per_slide} grid positions per slide, {grid_total} in all); best of {args.repeats} runs.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared with other users; load average "
        f"{os.getloadavg()[0]:.1f} at the end of the run), Python {platform.python_version()}.",
        "",
        "| variant | seconds | grid tiles/s | kept tiles/s |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {s:.2f} | {g / s:.0f} | {k / s:.0f} |" for name, s, g, k in rows]
    lines += [
        "",
        "`grid`: every grid position examined (the floor slices all of them). `kept`: tiles that passed the "
        "white filter and were written as PNG. The full run includes the first pass that checks every slide "
        "(decode + SVG rasterisation) before the client split, so each slide is decoded twice.",
        "",
        "Ratios:",
        "",
        *ratios,
        "",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {RESULTS}")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
