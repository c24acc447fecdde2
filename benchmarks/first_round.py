"""Where a run's first round goes on a device (issue 32): on an H200 the first round of configs/seed.toml took 79 s
against 12-18 s for the next ones (benchmarks/results/gpu_preset.md), on the CPU 6.6 s against 5.5 s.

One hospital of ``--tiles`` synthetic tiles, the preset's recipe (configs/seed.toml: FedSAF, head + base epoch,
precise BN, Fisher pass), in a fresh process, each step timed in order: the device's start (the first tensor on
it), building the client (the model on the device, channels-last, pooling as a mean under determinism), the tiles'
upload (the first evaluation reads them), the first training call, a second training call, and a second
evaluation; the first calls' excess over the second ones is what the first round pays once. Written to
``benchmarks/results/first_round.md`` (``--out``).

    python3 benchmarks/first_round.py                          # on a machine with a GPU
    .venv/bin/python benchmarks/first_round.py --device cpu --tiles 64 --input-size 64 --out /tmp/f.md
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, device_line, write_result  # noqa: E402
from benchmarks.gpu_throughput import product, sync, tiles  # noqa: E402
from federation.config.load import load_config  # noqa: E402
from federation.contract import TrainInstruction  # noqa: E402
from federation.strategies.context import recipe_from_config, resolved_nhead  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "first_round.md"
START = "the device's start (a first tensor on it)"
CLIENT = "the client: model on the device"
FIRST_EVAL = "first evaluation (uploads the test tiles)"
FIRST_TRAIN = "first training call"
SECOND_TRAIN = "second training call"
SECOND_EVAL = "second evaluation"
T = TypeVar("T")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiles", type=int, default=820, help="training tiles of the hospital")
    parser.add_argument("--input-size", type=int, default=128)
    parser.add_argument("--deterministic", choices=("true", "false"), default="true")
    parser.add_argument("--out", type=Path, default=RESULTS)
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
        ]
    )
    write_result(args.out, text)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
