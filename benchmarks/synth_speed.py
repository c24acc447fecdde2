"""Images per second of `gastric-fl synth` for SEED (512 px PNG) and BOT (2048 px TIFF + SVG) slides.

Stand-ins for the datasets of the FedSAF paper (001, Sec. 4.1, Table 2). Both formats, and BOT at 256 px as tests
use it, are timed in the same run, side by side: painting alone (``render_slide``) and the whole job
(``generate_dataset``: painting, PNG/TIFF encoding, SVG and JSON, writing to a temporary folder and renaming it).
Each figure is the best of ``--repeats`` runs, since other work on a shared machine only ever makes a run slower.

Run: .venv/bin/python benchmarks/synth_speed.py [--seed-images 40] [--bot-images 4] [--repeats 2]
Writes the figures to benchmarks/results/synth_speed.md (with this command line) and prints them.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.synth import FORMATS, generate_dataset, plan_dataset, render_slide


@dataclass(frozen=True)
class Timing:
    fmt: str
    images: int
    size: int
    render_s: float
    total_s: float
    bytes_written: int

    @property
    def render_ips(self) -> float:
        return self.images / self.render_s

    @property
    def total_ips(self) -> float:
        return self.images / self.total_s

    @property
    def megapixels_per_s(self) -> float:
        return self.images * self.size * self.size / self.total_s / 1e6


def measure(fmt: str, images: int, repeats: int, difficulty: float, size: int | None = None) -> Timing:
    size = FORMATS[fmt].size if size is None else size
    plans = plan_dataset(fmt, images, seed=0)
    render_best = total_best = float("inf")
    written = 0
    for rep in range(repeats):
        start = time.perf_counter()
        for plan in plans:
            render_slide(plan, fmt, size, difficulty)
        render_best = min(render_best, time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            out = Path(tmp) / f"{fmt}_{rep}"
            summary = generate_dataset(out, fmt, images, seed=0, difficulty=difficulty, size=size)
            total_best = min(total_best, time.perf_counter() - start)
            written = sum(f.stat().st_size for f in summary.files)
    return Timing(fmt, images, size, render_best, total_best, written)


def report(timings: list[Timing], command: str, difficulty: float) -> str:
    seed, bot, bot_small = timings
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    lines = [
        "# `gastric-fl synth` speed",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores visible, Python {platform.python_version()}, "
        f"NumPy {np.__version__}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        "(1 / 5 / 15 min; a load near or above the core count means other work shared the cores).",
        f"Difficulty {difficulty}; default class balance; best of the repeats.",
        "",
        "| format | slide | slides | paint only (slides/s) | whole job (slides/s) | s per slide | MPixel/s | "
        "MB written per slide |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in timings:
        lines.append(
            f"| {t.fmt} | {t.size}x{t.size} | {t.images} | {t.render_ips:.2f} | {t.total_ips:.2f} | "
            f"{t.total_s / t.images:.3f} | {t.megapixels_per_s:.1f} | {t.bytes_written / t.images / 1e6:.2f} |"
        )
    pixel_ratio = (bot.size / seed.size) ** 2
    time_ratio = (bot.total_s / bot.images) / (seed.total_s / seed.images)
    lines += [
        "",
        f"BOT / SEED time per slide: {time_ratio:.1f}x for {pixel_ratio:.0f}x the pixels "
        f"(encoding + writing: {100 * (1 - seed.render_s / seed.total_s):.0f}% of the SEED job, "
        f"{100 * (1 - bot.render_s / bot.total_s):.0f}% of the BOT job).",
        f"BOT at {bot_small.size} px takes {bot_small.total_s / bot_small.images:.2f} s per slide, "
        f"{(bot.total_s / bot.images) / (bot_small.total_s / bot_small.images):.1f}x less than at {bot.size} px "
        f"for {(bot.size / bot_small.size) ** 2:.0f}x fewer pixels: the same glands and nuclei are placed.",
        f"Quick start (60 SEED slides): about {60 / seed.total_ips:.1f} s of generation.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="Time gastric-fl synth for SEED and BOT slides.")
    parser.add_argument("--seed-images", type=int, default=40)
    parser.add_argument("--bot-images", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--difficulty", type=float, default=0.3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/synth_speed.md"))
    args = parser.parse_args()
    timings = [
        measure("seed", args.seed_images, args.repeats, args.difficulty),
        measure("bot", args.bot_images, args.repeats, args.difficulty),
        measure("bot", args.bot_images, args.repeats, args.difficulty, size=256),
    ]
    command = ".venv/bin/python benchmarks/synth_speed.py " + " ".join(sys.argv[1:])
    text = report(timings, command.strip(), args.difficulty)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
