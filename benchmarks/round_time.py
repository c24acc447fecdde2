"""Wall time of one round of the SEED preset (configs/seed.toml: FedSAF paper 001's SEED setting), with the
clients run one after another in this process (``run.workers = 0``) or in worker processes (``run.workers = 2``).

The dataset is a synthetic SEED-layout set made with ``gastric-fl synth`` and split like the paper's SEED setting
by ``configs/prepare_seed_noniid.toml`` (5 hospitals, non-IID, unbalanced, two grayscale), unless ``--data`` names
a prepared dataset. For each mode the script runs the preset for one round into a temporary run directory and
reads the round's wall time from ``aggregation.jsonl`` (train + aggregate + evaluate; data loading and process
start-up are reported separately as "start-up"). The modes are interleaved and repeated, medians reported.
It prints the figures and writes them, with the command, to benchmarks/results/round_time.md.

    .venv/bin/python benchmarks/round_time.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine, round_seconds, synthetic_dataset, write_result  # noqa: E402
from federation.config import load_config  # noqa: E402
from federation.hospital.data import read_manifest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "round_time.md"


def one_round(data: Path, settings: list[str], extra: list[str]) -> tuple[float, float]:
    """(round seconds, total seconds) of a one-round run of the SEED preset with ``settings``."""
    with tempfile.TemporaryDirectory() as tmp:
        seconds, total = round_seconds(
            ROOT / "configs" / "seed.toml", data, ["run.device=cpu", *settings, *extra], 1, Path(tmp) / "run"
        )
    return seconds[0], total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="prepared dataset (default: synthesise one)")
    parser.add_argument("--images", type=int, default=120, help="synthetic slides when --data is not given")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", dest="extra", action="append", default=[], help="extra section.key=value")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    if args.data is not None:
        data = args.data
    else:  # synthetic SEED slides -> the paper-like 5-hospital split (kept under data/ between runs)
        work = ROOT / "data" / "bench_round_time" / f"seed_{args.images}"
        data, _ = synthetic_dataset("seed", args.images, work, "configs/prepare_seed_noniid.toml")
    rows_manifest = read_manifest(data)
    clients = sorted({r.hospital for r in rows_manifest})
    train_tiles = sum(1 for r in rows_manifest if r.split == "train")
    test_tiles = len(rows_manifest) - train_tiles

    default_threads = torch.get_num_threads()
    modes = {
        f"sequential, {default_threads} torch threads (workers = 0, threads = 0)": ["run.workers=0", "run.threads=0"],
        "sequential, 1 torch thread (workers = 0, threads = 1)": ["run.workers=0", "run.threads=1"],
        "2 worker processes, 1 thread each (workers = 2)": ["run.workers=2", "run.threads=0"],
    }
    rounds: dict[str, list[float]] = {m: [] for m in modes}
    totals: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for name, settings in modes.items():
            seconds, total = one_round(data, settings, args.extra)
            rounds[name].append(seconds)
            totals[name].append(total)
            print(f"{name}: round {seconds:.1f} s, whole run {total:.1f} s", flush=True)

    sequential = statistics.median(rounds[next(iter(modes))])
    table = [
        f"| {name} | {statistics.median(rounds[name]):.1f} | {min(rounds[name]):.1f} | "
        f"{statistics.median(totals[name]) - statistics.median(rounds[name]):.1f} | "
        f"{sequential / statistics.median(rounds[name]):.2f} |"
        for name in modes
    ]
    config = load_config(ROOT / "configs" / "seed.toml", args.extra, data)
    command = "  .venv/bin/python benchmarks/round_time.py" + (f" --data {args.data}" if args.data else "")
    command += f" --images {args.images} --repeats {args.repeats}" + "".join(f" --set {s}" for s in args.extra)
    text = "\n".join(
        [
            "# Wall time of one round of the SEED preset: sequential clients vs worker processes",
            "",
            "Command:",
            "",
            command,
            "",
            f"{machine()}, torch {torch.__version__}; torch's default is "
            f"{default_threads} threads per process, "
            "each of W workers gets cores / W threads.",
            "",
            f"Workload: configs/seed.toml ({config.strategy.name}, {config.model.name}, input {config.data.input_size} "
            f"px, batch {config.data.batch_size}, {config.client.head_epochs} head + {config.client.epochs} base "
            f"epoch(s), Fisher batch {config.fedsaf.fisher_batch}) for one round on {len(clients)} hospitals with "
            f"{train_tiles} training and {test_tiles} test tiles "
            f"({'synthetic SEED slides: ' + str(args.images) if args.data is None else data}). "
            f"Modes interleaved, {args.repeats} repetitions, medians.",
            "",
            "| clients run | round (s, median) | round (s, best) | start-up (s) | speed vs first row |",
            "|---|---:|---:|---:|---:|",
            *table,
            "",
            "Round = configure, train every client, aggregate, evaluate every client (aggregation.jsonl `seconds`); "
            "start-up = the rest of the run: reading tiles, building models, and for workers starting the processes "
            "(a forkserver imports torch once, each worker then loads its own clients' tiles). Two torch threads per "
            "process lose badly as soon as another process wants a core (every operator's parallel region waits for "
            "the descheduled thread). "
            "Worker processes parallelise whole clients instead, which survives load, but pay the start-up once "
            "per run. The engine's defaults are `run.workers = 0`, `run.threads = 1`: no start-up, steady under "
            "load, and within a few percent of the workers per round; on a machine with idle cores to spare, "
            "`--set run.threads=0` (torch's default: all cores) or `--set run.workers=N` may be faster: measure "
            "with this script.",
            "",
        ]
    )
    print(text)
    write_result(args.out, text)


if __name__ == "__main__":
    main()
