"""The GPU preset's accuracy (issue 32): ``configs/seed_gpu.toml`` (bf16, batches of 256, the learning rate scaled
with the batch, the hospitals of a round at once) against ``configs/seed.toml`` (fp32, batches of 32), on the same
slides and seeds, paired by seed.

A synthetic SEED dataset (``gastric-fl synth --format seed --images N --difficulty 0.3``, prepared with
``configs/prepare_seed_noniid.toml``: 5 unequal hospitals, two grayscale, test tiles cut from raw tissue) is trained
``--rounds`` rounds from each seed under each variant, every run a ``gastric-fl train`` child process, ``--at-once``
of them at a time (a run's figures do not depend on what else runs: deterministic kernels). The figures are the
last round's test accuracy and AUC averaged over hospitals (`federation.report.summary_row`, as every published table
reads them); each variant's difference to the CPU preset is paired by seed, with a 95% t interval and the minimum
detectable difference at 80% power (`federation.ablation.paired.paired_interval`). Each run's small files (config,
metrics, aggregation, summary) are kept under ``--runs`` so the table can be checked and rebuilt (``--table-only``); a
run kept there is not trained again, so a call cut short resumes. ``--first-seed`` starts the seeds elsewhere than 0 (a
longer run of one seed kept apart), and ``--by-round`` adds each variant's accuracy round by round (`by_round_section`):
what the presets' own 50 rounds change against the 12 rounds of the default comparison.

    python3 benchmarks/gpu_preset.py                          # on a machine with a GPU
    .venv/bin/python benchmarks/gpu_preset.py --device cpu --slides 24 --rounds 1 --seeds 1 --out /tmp/p.md \\
        --runs /tmp/p_runs                                     # a quick check of the script on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from _common import CLI, ROOT, command_line, device_line, synthetic_dataset, write_result

from federation.ablation.paired import paired_interval, paired_text
from federation.report import load_run, per_hospital, summary_row
from federation.runfiles import METRICS_FILE
from infra.formats import manifest_sha256

RESULTS = ROOT / "benchmarks" / "results" / "gpu_preset.md"
RUNS = ROOT / "benchmarks" / "results" / "gpu_preset_runs"
KEPT = ("config.toml", "metrics.jsonl", "aggregation.jsonl", "summary.json")
VARIANTS = {  # name -> (preset, settings)
    "seed": ("seed.toml", ()),
    "seed_gpu": ("seed_gpu.toml", ()),
    "seed_gpu_batch128": ("seed_gpu.toml", ("data.batch_size=128", "client.lr=0.04")),
}
REFERENCE = "seed"


def _train(
    preset: str, settings: tuple[str, ...], data: Path, run_dir: Path, seed: int, rounds: int, device: str
) -> None:
    sets = [*settings, f"run.seed={seed}", f"run.rounds={rounds}", f"run.device={device}"]
    subprocess.run(
        [*CLI, "train", "--config", str(ROOT / "configs" / preset), "--data", str(data), "--out", str(run_dir),
         "--overwrite", "-q", *[a for s in sets for a in ("--set", s)]],
        check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def _seconds(times: dict[str, float], stage: str) -> str:
    return f"{times[stage]:.0f} s" if stage in times else "made by an earlier call"


def _seed_range(seeds: range) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def accuracy_by_hospital(run: Path) -> dict[int, float]:
    """Each hospital's test accuracy in the round the run's averaged figures are read from
    (`federation.report.per_hospital`: its last complete round)."""
    rows = per_hospital([load_run(run)])
    return {int(r["client"]): float(r["test_acc"]) for r in rows if r["test_acc"] is not None}


def hospital_section(runs: Path, variants: list[str], seeds: range) -> list[str]:
    """Per variant and hospital, the last round's test accuracy by seed: where a variant's difference comes from."""
    by_variant = {
        name: {s: accuracy_by_hospital(runs / f"{name}_seed-{s}") for s in seeds
               if (runs / f"{name}_seed-{s}" / METRICS_FILE).is_file()}
        for name in variants
    }  # fmt: skip
    hospitals = sorted({h for per_seed in by_variant.values() for acc in per_seed.values() for h in acc})
    if not hospitals:
        return []
    rows = []
    for name, per_seed in by_variant.items():
        cells = [" / ".join(f"{per_seed[s][h]:.3f}" if h in per_seed.get(s, {}) else "-" for s in seeds)
                 for h in hospitals]  # fmt: skip
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return [
        "Per hospital: the last round's test accuracy by seed.",
        "",
        "| variant | " + " | ".join(f"hospital {h}" for h in hospitals) + " |",
        "|---|" + "---|" * len(hospitals),
        *rows,
        "",
    ]


def by_round_section(runs: Path, variants: list[str], seeds: range) -> list[str]:
    """Per round (the first, every fifth, the 12th and the last): each variant's test accuracy averaged over
    hospitals (`federation.report.round_stats`), and its smallest hospital's, both averaged over the seeds whose runs
    reached that round; each variant's difference to configs/seed.toml paired by seed. What a longer run (the
    presets' own 50 rounds) changes."""
    loaded = {
        (name, s): load_run(runs / f"{name}_seed-{s}") for name in variants for s in seeds
        if (runs / f"{name}_seed-{s}" / METRICS_FILE).is_file()
    }  # fmt: skip
    accuracy: dict[tuple[str, int, int], float] = {}  # (variant, seed, round) -> averaged, complete rounds only
    smallest: dict[tuple[str, int, int], float] = {}  # the same for the hospital with the fewest training tiles
    for (name, s), run in loaded.items():
        tiles = {int(m["client"]): int(m["num_train"]) for m in run.metrics if m.get("num_train") is not None}
        if not tiles:  # a run that has not finished a round yet
            continue
        least = min(tiles, key=lambda h: (tiles[h], h))
        for stats in run.rounds:
            if stats.complete:
                accuracy[(name, s, stats.round)] = stats.avg_test_acc
        for m in run.metrics:
            if int(m["client"]) == least and m.get("test_acc") is not None:
                smallest[(name, s, int(m["round"]))] = float(m["test_acc"])
    if not accuracy:
        return []
    last = max(r for _, _, r in accuracy)
    shown = [r for r in range(1, last + 1) if r in (1, 12, last) or r % 5 == 0]

    def mean(values: dict[tuple[str, int, int], float], name: str, r: int) -> str:
        known = [values[(name, s, r)] for s in seeds if (name, s, r) in values]
        return _fmt(sum(known) / len(known) if known else None)

    rows = []
    for r in shown:
        cells = []
        for name in variants:
            cell = f"{mean(accuracy, name, r)} ({mean(smallest, name, r)})"
            if name != REFERENCE:
                diffs = [
                    accuracy[(name, s, r)] - accuracy[(REFERENCE, s, r)]
                    for s in seeds
                    if (name, s, r) in accuracy and (REFERENCE, s, r) in accuracy
                ]
                cell += f" | {paired_text(paired_interval(diffs)) or 'n/a'}"
            cells.append(cell)
        rows.append(f"| {r} | " + " | ".join(cells) + " |")
    header = " | ".join(name if name == REFERENCE else f"{name} | {name} - {REFERENCE}" for name in variants)
    columns = sum(1 if name == REFERENCE else 2 for name in variants)
    return [
        "By round: test accuracy averaged over hospitals (in brackets, the smallest hospital's), mean over the seeds "
        f"that reached the round; differences to {REFERENCE} paired by seed.",
        "",
        f"| round | {header} |",
        "|---:|" + "---:|" * columns,
        *rows,
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--slides", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed .. first-seed + seeds - 1")
    parser.add_argument("--by-round", action="store_true", help="add each variant's accuracy round by round")
    parser.add_argument("--at-once", type=int, default=4, help="training runs at a time")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gfl_gpu_preset")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=Path, default=RUNS, help="where each run's small files are kept")
    parser.add_argument("--table-only", action="store_true", help="write the table from the runs kept, train none")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"which to train, of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or REFERENCE not in chosen:
        parser.error(f"--variants: {', '.join(unknown) or 'the reference'} ({REFERENCE} is always needed)")
    times: dict[str, float] = {}
    # the CPU preset's runs, the longest, first
    if args.seeds < 1 or args.first_seed < 0:
        parser.error(f"--seeds {args.seeds} --first-seed {args.first_seed}: give at least one seed, from 0 up")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    in_order = [name for name in VARIANTS if name in chosen]
    cells = [(name, seed) for name in in_order for seed in seeds]

    def finished(cell: tuple[str, int]) -> dict[str, Any] | None:
        kept = args.runs / f"{cell[0]}_seed-{cell[1]}"
        if not (kept / "summary.json").is_file():
            return None
        row = summary_row(load_run(kept))
        return row if row["status"] == "finished" else None

    if not args.table_only:
        data, times = synthetic_dataset("seed", args.slides, args.work,
                                        str(ROOT / "configs" / "prepare_seed_noniid.toml"),
                                        workers=min(8, os.cpu_count() or 1))  # fmt: skip
        digest = manifest_sha256(data)
        for kept in sorted(args.runs.glob("*/summary.json")):  # resumed runs must pair with runs on the same tiles
            recorded = json.loads(kept.read_text(encoding="utf-8")).get("dataset_sha256")
            if recorded != digest:
                sys.exit(f"{kept.parent} was trained on other tiles (manifest sha256 {recorded}, now {digest}): "
                         f"move {args.runs} aside or give the same --slides")  # fmt: skip

        def run(cell: tuple[str, int]) -> None:
            name, seed = cell
            if finished(cell) is not None:  # kept from an earlier call: the script resumes
                return
            preset, settings = VARIANTS[name]
            run_dir = args.work / "runs" / f"{name}_seed-{seed}"
            _train(preset, settings, data, run_dir, seed, args.rounds, args.device)
            kept = args.runs / run_dir.name
            kept.mkdir(parents=True, exist_ok=True)
            for file in KEPT:
                shutil.copy2(run_dir / file, kept / file)
            print(f"{run_dir.name}: done", flush=True)

        with ThreadPoolExecutor(max_workers=args.at_once) as pool:
            list(pool.map(run, cells))
    figures = {cell: finished(cell) for cell in cells}

    def value(name: str, seed: int, key: str) -> float | None:
        row = figures[(name, seed)]
        return None if row is None or row[key] is None else float(row[key])

    rows = []
    for name in in_order:
        preset, settings = VARIANTS[name]
        acc = [value(name, s, "avg_test_acc") for s in seeds]
        known_acc = [a for a in acc if a is not None]
        known_auc = [a for s in seeds if (a := value(name, s, "avg_test_auc")) is not None]
        mean_acc = sum(known_acc) / len(known_acc) if known_acc else None
        mean_auc = sum(known_auc) / len(known_auc) if known_auc else None
        paired = []
        for key in ("avg_test_acc", "avg_test_auc"):
            if name == REFERENCE:
                paired.append("(reference)")
                continue
            diffs = [
                ours - theirs
                for s in seeds
                if (ours := value(name, s, key)) is not None and (theirs := value(REFERENCE, s, key)) is not None
            ]
            paired.append(paired_text(paired_interval(diffs)) or "n/a")
        shown = f"configs/{preset}" + (f" with {', '.join(settings)}" if settings else "")
        per_seed = " / ".join("-" if a is None else f"{a:.3f}" for a in acc)
        rows.append(
            f"| {name} | {shown} | {per_seed} | {_fmt(mean_acc)} | {_fmt(mean_auc)} | {paired[0]} | {paired[1]} |"
        )
    text = "\n".join(
        [
            "# The GPU preset's accuracy against the CPU preset",
            "",
            f"Command: `{command_line('gpu_preset.py')}`",
            "",
            device_line(args.device),
            "",
            f"Data: {args.slides} synthetic SEED slides (`gastric-fl synth --difficulty 0.3`, "
            f"{_seconds(times, 'synth')}) prepared with configs/prepare_seed_noniid.toml "
            f"({_seconds(times, 'prepare')}): 5 unequal hospitals, "
            f"test tiles from raw tissue. Each variant trained {args.rounds} rounds from {_seed_range(seeds)} "
            f"(`run.seed`), {args.at_once} runs at a time; figures of the last round, averaged over hospitals; "
            "differences to configs/seed.toml paired by seed, mean [95% t interval], `*` where the interval excludes "
            "0, (MDD m): the smallest true difference these seeds find with 80% power at alpha 0.05. Each run's "
            f"files: `{args.runs.relative_to(ROOT) if args.runs.is_relative_to(ROOT) else args.runs}`.",
            "",
            "| variant | settings | test accuracy by seed | mean accuracy | mean AUC | accuracy - seed.toml | "
            "AUC - seed.toml |",
            "|---|---|---|---:|---:|---:|---:|",
            *rows,
            "",
            *hospital_section(args.runs, in_order, seeds),
            *(by_round_section(args.runs, in_order, seeds) if args.by_round else []),
        ]
    )
    print(text)
    write_result(args.out, text)


if __name__ == "__main__":
    main()
