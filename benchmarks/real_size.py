"""Real-size data (issue 32, item 4): a SEED-sized dataset (1,770 slides of 512x512, 5 hospitals) or a BOT-sized
one (700 slides of 2048x2048, 10 hospitals; FedSAF paper 001, Sec. 4.1, Table 2) made by ``gastric-fl synth``,
prepared with the shipped presets, FedSAF rounds timed on the CPU or a GPU, and from them the time of the paper's
grid of Tables 4-7.

1. **synth**: ``gastric-fl synth --format F --images N --difficulty 0.3 --workers W`` (W = the cores);
2. **prepare**: ``gastric-fl prepare --config configs/prepare_seed_noniid.toml`` (SEED: 5 unequal, non-IID
   hospitals, two grayscale) or ``configs/prepare_bot.toml`` (BOT: 10 hospitals, 256 px tiles, at most 32 per
   slide), ``--workers W``;
3. **train**: the preset (``configs/seed.toml`` / ``configs/bot.toml``: FedSAF, a head epoch and a base epoch, the
   Fisher pass, augmentation) for ``--rounds`` rounds per variant. A round's time is the last round's ``seconds``
   in ``aggregation.jsonl`` (train, aggregate and evaluate every hospital; the first round also pays the GPU's
   warm-up); start-up is the rest of the run (reading and decoding tiles, building models, starting workers).
   Variants on the CPU: the preset as shipped. On a GPU: the preset (fp32, batch 32, hospitals one after
   another), bf16 at batch 256, and bf16 at batch 256 with every hospital of a round trained at once on the one
   GPU (``run.workers`` = the hospitals: one process each, sharing the device);
4. **estimate**: the distinct runs of ``configs/ablation_paper.toml``'s blocks over this preset with ``--seeds``
   seeds each (cells whose resolved settings are equal run once, as ``gastric-fl ablate`` does), each costed at
   start-up + the preset's rounds x the FedSAF round. An upper bound: FedAvg, FedProx and FedAMP train one
   epoch a round where FedSAF trains two and adds the Fisher pass.

synth and prepare are skipped when ``--work`` already holds their output; their times are then read from the
``times.json`` the first run wrote there. The script prints the figures and writes them, with the command, to
``benchmarks/results/real_size_<format>[_gpu].md``.

    .venv/bin/python benchmarks/real_size.py --format seed              # 1,770 slides on this machine's CPU
    .venv/bin/python benchmarks/real_size.py --format bot
    .venv/bin/python benchmarks/real_size.py --format seed --device cuda
    .venv/bin/python benchmarks/real_size.py --format seed --slides 40 --rounds 1 --out /tmp/x.md   # a check
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, machine, round_seconds, synthetic_dataset, write_result  # noqa: E402
from federation.ablation import Plan, load_plan  # noqa: E402
from federation.config import load_config  # noqa: E402
from federation.hospital.data import read_manifest  # noqa: E402


@dataclass(frozen=True)
class Preset:
    """A real-size setting: the paper's slide count and hospitals, and the presets that make and train it."""

    slides: int
    hospitals: int
    prepare: str
    train: str


PRESETS = {
    "seed": Preset(1770, 5, "configs/prepare_seed_noniid.toml", "configs/seed.toml"),
    "bot": Preset(700, 10, "configs/prepare_bot.toml", "configs/bot.toml"),
}


VARIANTS = ("preset", "bf16", "at-once")


def variants(device: str, hospitals: int, only: tuple[str, ...] = VARIANTS) -> dict[str, list[str]]:
    """Variant name -> its ``--set`` settings (module docstring, step 3); ``only``: which of `VARIANTS`."""
    if device == "cpu":
        return {"the preset (fp32, batch 32, hospitals one after another)": ["run.device=cpu"]}
    fast = ["run.device=cuda", "run.precision=bf16", "data.batch_size=256"]
    every = {
        "preset": ("the preset (fp32, batch 32, hospitals one after another)", ["run.device=cuda"]),
        "bf16": ("bf16, batch 256, hospitals one after another", fast),
        "at-once": (
            f"bf16, batch 256, {hospitals} hospitals at once (run.workers = {hospitals})",
            [*fast, f"run.workers={hospitals}"],
        ),
    }
    return dict(every[key] for key in VARIANTS if key in only)


def grid_runs(preset: Preset, data: Path, settings: list[str], seeds: int) -> tuple[int, int]:
    """(distinct runs, rounds per run) of the paper's grid over this preset with ``seeds`` seeds a cell."""
    paper = load_plan(ROOT / "configs" / "ablation_paper.toml", seeds=seeds)
    plan = Plan(ROOT / preset.train, paper.blocks, seeds, settings, data)
    plan.first_seed = plan.base_config().run.seed
    owners = plan.owners(plan.cells())
    return len(set(owners.values())), plan.base_config().run.rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=sorted(PRESETS), default="seed")
    parser.add_argument("--slides", type=int, default=None, help="default: the paper's count (1,770 / 700)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per variant; the last one is reported")
    parser.add_argument(
        "--only", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="GPU variants to time (default: all)"
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per cell of the grid estimate")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for synth/prepare")
    parser.add_argument("--work", type=Path, default=None, help="default: data/bench_real_size/<format>_<slides>")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    preset = PRESETS[args.format]
    slides = args.slides or preset.slides
    work = args.work or ROOT / "data" / "bench_real_size" / f"{args.format}_{slides}"
    out = (
        args.out
        or ROOT / "benchmarks" / "results" / f"real_size_{args.format}{'_gpu' if args.device != 'cpu' else ''}.md"
    )

    data, times = synthetic_dataset(args.format, slides, work, preset.prepare, args.workers)
    rows = read_manifest(data)
    train_tiles = sum(1 for r in rows if r.split == "train")
    hospitals = len({r.hospital for r in rows})
    print(f"synth {times['synth']:.0f} s, prepare {times['prepare']:.0f} s, {len(rows)} tiles", flush=True)

    measured: dict[str, tuple[float, float]] = {}
    chosen = variants(args.device, hospitals, tuple(args.only))
    for name, settings in chosen.items():
        seconds, total = round_seconds(ROOT / preset.train, data, settings, args.rounds, work / "run")
        measured[name] = (seconds[-1], total - sum(seconds))  # the last round; start-up is the rest
        print(f"{name}: round {measured[name][0]:.1f} s, start-up {measured[name][1]:.1f} s", flush=True)

    config = load_config(ROOT / preset.train, [], data)
    passes = train_tiles * (config.client.head_epochs + config.client.epochs)
    fastest = min(measured, key=lambda n: measured[n][0])
    runs, rounds = grid_runs(preset, data, chosen[fastest], args.seeds)
    table = [
        f"| {name} | {round_s:.1f} | {passes / round_s:,.0f} | {startup:.1f} | "
        f"{(startup + rounds * round_s) / 60:.1f} | {runs * (startup + rounds * round_s) / 3600:.1f} |"
        for name, (round_s, startup) in measured.items()
    ]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    text = "\n".join(
        [
            f"# Real-size data: a {args.format.upper()}-sized dataset, prepared and federated ({device_name})",
            "",
            f"Command: `{command_line('real_size.py')}`",
            "",
            f"{machine()}; torch {torch.__version__}; device {args.device} ({device_name}).",
            "",
            f"Data: {slides} synthetic {args.format.upper()} slides (`gastric-fl synth --difficulty 0.3`), prepared "
            f"with `{preset.prepare}` into {hospitals} hospitals: {len(rows):,} tiles, {train_tiles:,} of them "
            f"for training. Training: `{preset.train}` ({config.strategy.name}, {config.model.name}, input "
            f"{config.data.input_size} px, {config.client.head_epochs} head + {config.client.epochs} base "
            f"epoch(s), Fisher pass, augmentation), {args.rounds} round(s) per variant, the last one reported.",
            "",
            "| stage | wall s |",
            "|---|---:|",
            f"| synth ({args.workers} processes) | {times['synth']:.0f} |",
            f"| prepare ({args.workers} threads) | {times['prepare']:.0f} |",
            "",
            f"| training variant | round s | passes/s | start-up s | one run of {rounds} rounds, min | "
            f"the paper's grid, {runs} runs, h |",
            "|---|---:|---:|---:|---:|---:|",
            *table,
            "",
            f"passes/s = training tiles x epochs a round ({passes:,}) / round seconds (the round also evaluates "
            "every hospital). The grid: `configs/ablation_paper.toml`'s blocks (methods, components, distances, "
            f"nhead) over `{preset.train}` with {args.seeds} seeds a cell, {runs} distinct runs, each costed at "
            "start-up + rounds x the FedSAF round, one run after another (an upper bound: FedAvg, FedProx and "
            "FedAMP train one epoch a round, FedSAF two and a Fisher pass). `gastric-fl ablate --workers N` runs N "
            "cells at once, one per GPU where there are several, and `--ray ADDRESS` over a Ray cluster.",
            "",
        ]
    )
    print(text)
    write_result(out, text)


if __name__ == "__main__":
    main()
