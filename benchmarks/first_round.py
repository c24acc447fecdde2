"""Where a run's first round goes on a device (issue 32): on an H200 the first round of configs/seed.toml took 79 s
against 12-18 s for the next ones (benchmarks/results/gpu_preset.md), on the CPU 6.6 s against 5.5 s.

One hospital of ``--tiles`` synthetic tiles, the preset's recipe (configs/seed.toml: FedSAF, head + base epoch,
precise BN, Fisher pass), in a fresh process, each step timed in order: the device's start (the first tensor on
it), building the client (the model on the device, channels-last, pooling as a mean under determinism), the tiles'
upload (the first evaluation reads them), the first training call, a second training call, and a second
evaluation; the first calls' excess over the second ones is what the first round pays once. Then two more hospitals'
first calls: one whose tile count gives other last batches (new batch shapes), one with the first hospital's count
(the same shapes); if only the first pays again, the start-up cost is per batch shape, not per process. A fourth,
with new shapes again and cuDNN switched off (``torch.backends.cudnn.flags(enabled=False)``: PyTorch's own
convolution kernels), tells whether that cost is cuDNN's: building a convolution's execution plan for a new shape,
which some cuDNN 9 releases compile at run time (seen at about 1.5 s a depthwise convolution).

``--runs DIR ...`` adds what finished runs recorded (``metrics.jsonl``: each hospital's seconds a round): per
hospital, its first round against the median of its later rounds, so the excess can be read per hospital and set
against its tile count (the GPU runs of ``benchmarks/results/gpu_preset_runs`` and their CPU replication). Written to
``benchmarks/results/first_round.md`` (``--out``).

    python3 benchmarks/first_round.py                          # on a machine with a GPU
    .venv/bin/python benchmarks/first_round.py --device cpu --tiles 64 --input-size 64 --out /tmp/f.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any, TypeVar

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, device_line, write_result  # noqa: E402
from benchmarks.gpu_throughput import product, sync, tiles  # noqa: E402
from federation.config.load import load_config  # noqa: E402
from federation.hospital.data import HospitalData  # noqa: E402
from federation.runfiles import METRICS_FILE, SUMMARY_FILE, read_metrics  # noqa: E402
from federation.strategies.context import recipe_from_config, resolved_nhead  # noqa: E402
from federation.wire.contract import TrainInstruction  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "first_round.md"
START = "the device's start (a first tensor on it)"
CLIENT = "the client: model on the device"
FIRST_EVAL = "first evaluation (uploads the test tiles)"
FIRST_TRAIN = "first training call"
SECOND_TRAIN = "second training call"
SECOND_EVAL = "second evaluation"
OTHER_SHAPES = "another hospital, {n} tiles (other batch shapes): client, first training call and evaluation"
SAME_SHAPES = "another hospital, {n} tiles (the first one's batch shapes): client, first training call and evaluation"
NO_CUDNN = (
    "another hospital, {n} tiles (other batch shapes again), cuDNN off: client, first training call and evaluation"
)
T = TypeVar("T")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiles", type=int, default=820, help="training tiles of the hospital")
    parser.add_argument("--input-size", type=int, default=128)
    parser.add_argument("--deterministic", choices=("true", "false"), default="true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--runs", type=Path, nargs="*", default=[], help="finished runs whose first rounds to show")
    args = parser.parse_args()
    device = torch.device(args.device)
    config = load_config(ROOT / "configs" / "seed.toml")
    recipe = recipe_from_config(
        config,
        head_epochs=config.client.head_epochs,
        fisher_batch=config.fedsaf.fisher_batch if config.fedsaf.fim else 0,
    )
    data = tiles(args.tiles, args.input_size, 0)
    steps: dict[str, float] = {}

    def timed(name: str, work: Callable[[], T]) -> T:
        start = time.perf_counter()
        result = work()
        sync(device)
        steps[name] = time.perf_counter() - start
        print(f"{steps[name]:8.2f} s  {name}", flush=True)
        return result

    deterministic = args.deterministic == "true"
    nhead = resolved_nhead(config)
    timed(START, lambda: torch.zeros(1, device=device))
    client = timed(CLIENT, lambda: product(data, device, config.data.batch_size, "fp32", recipe, nhead, deterministic))
    timed(FIRST_EVAL, client.evaluate)
    timed(FIRST_TRAIN, lambda: client.train(TrainInstruction(0, recipe), server_round=1, seed=1))
    timed(SECOND_TRAIN, lambda: client.train(TrainInstruction(0, recipe), server_round=2, seed=2))
    timed(SECOND_EVAL, client.evaluate)
    steady = steps[SECOND_TRAIN] + steps[SECOND_EVAL]

    # Is what the first calls pay per process (the device's kernels), or per batch shape (the convolutions' plans
    # for a new batch size)? On the GPU every hospital of a run paid about the same first-round excess whatever its
    # tile count (benchmarks/results/first_round.md): a hospital with other tail batches against one with the same.
    def first_calls(hospital: HospitalData) -> None:
        c = product(hospital, device, config.data.batch_size, "fp32", recipe, nhead, deterministic)
        c.train(TrainInstruction(0, recipe), server_round=1, seed=1)
        c.evaluate()

    other_n, same_n = args.tiles + 7, args.tiles
    other_name, same_name = OTHER_SHAPES.format(n=other_n), SAME_SHAPES.format(n=same_n)
    for name, n, seed in ((other_name, other_n, 1), (same_name, same_n, 2)):
        hospital = tiles(n, args.input_size, seed)
        timed(name, lambda hospital=hospital: first_calls(hospital))
    no_cudnn_n = args.tiles + 13
    no_cudnn_name = NO_CUDNN.format(n=no_cudnn_n)
    without = tiles(no_cudnn_n, args.input_size, 3)

    def first_calls_without_cudnn() -> None:
        with torch.backends.cudnn.flags(enabled=False):
            first_calls(without)

    try:
        timed(no_cudnn_name, first_calls_without_cudnn)
        no_cudnn = f"{steps[no_cudnn_name] - steady:.2f} s"
    except RuntimeError as error:  # deterministic mode may refuse a kernel outside cuDNN
        no_cudnn = f"not measured ({str(error).splitlines()[0]})"
        print(f"  cuDNN off: {no_cudnn}", flush=True)
    once = steps[FIRST_TRAIN] - steps[SECOND_TRAIN] + steps[FIRST_EVAL] - steps[SECOND_EVAL]
    start_up = once + steps[START] + steps[CLIENT]
    text = "\n".join(
        [
            "# Where the first round goes",
            "",
            f"Command: `{command_line('first_round.py')}`",
            "",
            device_line(str(device)),
            "",
            f"One hospital of {args.tiles} synthetic tiles at {args.input_size} px, configs/seed.toml's recipe at "
            f"batch {config.data.batch_size} in fp32, run.deterministic = {args.deterministic}; each step in order "
            "in one fresh process.",
            "",
            "| step | seconds |",
            "|---|---:|",
            *[f"| {name} | {value:.2f} |" for name, value in steps.items()],
            "",
            f"Paid once by the first training call and evaluation, over the second ones: {once:.2f} s; with the "
            f"device's start and the client: {start_up:.2f} s.",
            "",
            "A second hospital's first calls over the first hospital's second ones: "
            f"{steps[other_name] - steady:.2f} s with other batch shapes ({other_n} tiles: other last training "
            "and evaluation batches), "
            f"{steps[same_name] - steady:.2f} s with the first hospital's shapes ({same_n} tiles). Where the first "
            "is much larger, the first round's cost is paid per batch shape (each hospital's own last batches), "
            "not once per process. "
            f"With new shapes again and cuDNN off ({no_cudnn_n} tiles): {no_cudnn}; where this is small and the "
            "other-shapes figure large, the cost is cuDNN's per shape "
            f"(cuDNN {torch.backends.cudnn.version() if device.type == 'cuda' else 'not used on the CPU'}).",
            "",
            *runs_section(args.runs),
        ]
    )
    write_result(args.out, text)
    print(f"written: {args.out}")


def first_round_excess(run: Path) -> list[tuple[int, int, float, float]]:
    """Per hospital of ``run`` (its ``metrics.jsonl``, `federation.runfiles.read_metrics`): (hospital, training
    tiles, first round's seconds, median of the later rounds' seconds); hospitals without a later round are left
    out."""
    per: dict[int, dict[int, dict[str, Any]]] = {}
    for record in read_metrics(run / METRICS_FILE).records:
        if record.get("seconds") is not None:
            per.setdefault(int(record["client"]), {})[int(record["round"])] = record
    out = []
    for hospital, rounds in sorted(per.items()):
        first = min(rounds)
        later = [float(r["seconds"]) for n, r in rounds.items() if n != first]
        if later:
            out.append((hospital, int(rounds[first]["num_train"]), float(rounds[first]["seconds"]), median(later)))
    return out


def runs_section(runs: list[Path]) -> list[str]:
    """The markdown section of ``--runs``: one row per run and hospital."""
    if not runs:
        return []
    rows = []
    for run in runs:
        machines = json.loads((run / SUMMARY_FILE).read_text(encoding="utf-8")).get("machines") or ["not recorded"]
        shown = run.resolve().relative_to(ROOT) if run.resolve().is_relative_to(ROOT) else run
        for hospital, tiles_n, first, steady in first_round_excess(run):
            rows.append(
                f"| `{shown}` | {machines[-1]} | {hospital} | {tiles_n:,} | {first:.1f} | {steady:.1f} | "
                f"{first - steady:+.1f} |"
            )
    return [
        "## What finished runs recorded",
        "",
        "Each hospital's seconds in a round (`metrics.jsonl`: its training, Fisher pass and evaluation) in the first "
        "round against the median of the later rounds.",
        "",
        "| run | machine | hospital | training tiles | first round s | later rounds, median s | excess s |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]


if __name__ == "__main__":
    main()
