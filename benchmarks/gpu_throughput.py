"""Training throughput on a GPU (issue 32): the product's training loop against a bare PyTorch loop on the same
tiles, model, batch and precision, side by side in one run; "passes/s" = training tiles x epochs / seconds.

Workload: ``--hospitals`` hospitals of ``--tiles`` synthetic ``uint8`` RGB tiles each at ``--input-size`` px (the
content does not change a step's cost), MobileNetV3-Small (paper 001, Sec. 4.3.1), SGD momentum 0.9.

- **bare, fp32, batch B**: tiles held on the GPU as uint8, random flips on the GPU, ``normalise``, forward,
  cross-entropy, backward, step; one epoch over all parameters.
- **bare, bf16 + channels-last, batch 256**: the same under bf16 autocast with channels-last memory.
- **bare, fp32 + channels-last, batch B**: the fp32 loop with the model and inputs in channels-last memory, as the
  product holds them on a GPU at either precision: whether the layout is part of the fp32 gap.
- **product, plain**: `federation.hospital.trainer.Trainer.train` with a one-phase recipe (one epoch over all
  parameters, no
  precise BN, no Fisher pass): the same work as the bare loop plus the product's augmentation
  (`federation.hospital.gpu.augment`: symmetries, HSV, brightness/contrast) and bookkeeping, at the same batch and
  precision;
- **product, the preset**: the FedSAF recipe of ``configs/seed.toml`` (a head epoch, then a base epoch, precise
  BN, the Fisher pass of ``fedsaf.fisher_batch`` tiles) with augmentation, at the preset's batch (32) in fp32, and
  at batch 256 in bf16; and a whole round: every hospital trained and evaluated one after another, as the engine
  runs them on one GPU;
- **deterministic off**: the plain recipe and the preset again with ``run.deterministic = false`` (cuDNN
  autotuning, CUDA's adaptive pooling), as the bare loop runs: what determinism costs; and the plain recipe with
  augmentation off too, at both batches and precisions: the bare loop's work plus only the product's bookkeeping.

Each figure is the median of ``--repeats`` timed epochs after one warm-up, the loops interleaved. It prints the
table and writes it, with the command and the versions, to ``benchmarks/results/gpu_throughput.md`` (``--out``).
Without a GPU it runs the same loops on the CPU (smaller, ``--device cpu``) so the script is checked anywhere.

    .venv/bin/python benchmarks/gpu_throughput.py            # on a machine with a CUDA GPU
    .venv/bin/python benchmarks/gpu_throughput.py --device cpu --tiles 64 --input-size 64 --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import command_line, device_line, write_result  # noqa: E402
from federation import gpu  # noqa: E402
from federation.config.load import load_config  # noqa: E402
from federation.hospital.data import HospitalData  # noqa: E402
from federation.hospital.trainer import Trainer  # noqa: E402
from federation.strategies.context import recipe_from_config, resolved_nhead  # noqa: E402
from federation.wire.contract import Recipe, TrainInstruction  # noqa: E402
from models import base_keys, create_model, split_units  # noqa: E402
from models.preprocess import default_stats  # noqa: E402
from models.split import head_keys  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu_throughput.md"


def tiles(n: int, size: int, seed: int) -> HospitalData:
    """``n`` random RGB tiles with balanced labels."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
    y = (np.arange(n) % 2).astype(np.int64)
    test = max(8, n // 5)
    return HospitalData(seed, x, y, x[:test], y[:test], [f"t{i}.png" for i in range(test)], grayscale=False)


def sync(device: torch.device) -> None:
    """Wait for the GPU, so that a timing covers the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(
    data: HospitalData, device: torch.device, batch: int, bf16: bool, channels_last: bool
) -> Callable[[int], None]:
    """One epoch of the plainest fast loop: uint8 tiles on the device, flips there, optional bf16, optional
    channels-last memory (the product holds its model channels-last on a GPU at either precision)."""
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small").to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    held = torch.from_numpy(data.train_x).to(device)
    labels = torch.from_numpy(data.train_y).to(device)
    stats = default_stats(3)
    model.train()

    def epoch(r: int) -> None:
        gpu.kernels(device, False)  # the bare loop: fast kernels, whatever a client set before it
        generator = torch.Generator(device=device).manual_seed(r)
        order = torch.randperm(data.num_train, generator=generator, device=device)
        for index in torch.split(order, batch):
            if index.numel() < 2:
                continue
            x = held.index_select(0, index)
            flip = torch.rand(x.shape[0], generator=generator, device=device) < 0.5
            x = torch.where(flip.view(-1, 1, 1, 1), x.flip(2), x)
            inputs = gpu.normalise(x, *stats)
            if not channels_last:
                inputs = inputs.contiguous()
            optimizer.zero_grad(set_to_none=True)
            with gpu.autocast(device, "bf16" if bf16 else "fp32"):
                loss = F.cross_entropy(model(inputs), labels.index_select(0, index))
            loss.backward()
            optimizer.step()

    return epoch


def product(
    data: HospitalData,
    device: torch.device,
    batch: int,
    precision: str,
    recipe: Recipe,
    nhead: int,
    deterministic: bool,
    augment: bool = True,
) -> Trainer:
    """The product's client over ``data``: its model, shared keys and head as the engine builds them."""
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small")
    units = split_units(model)
    return Trainer(
        data, model, base_keys(units, nhead), batch_size=batch, eval_batch_size=max(128, batch), augment=augment,
        device=device, head_keys=head_keys(units, nhead), precision=precision, deterministic=deterministic,
    )  # fmt: skip


def determinism_row(data: HospitalData, device: torch.device, recipe: Recipe, nhead: int, deterministic: bool) -> str:
    """Train the same hospital twice from one seed (2 rounds) and compare the weights and test losses."""
    outcomes = []
    for _ in range(2):
        client = product(data, device, 32, "fp32", recipe, nhead, deterministic)
        losses = []
        for r in (1, 2):
            client.train(TrainInstruction(0, recipe), server_round=r, seed=r)
            losses.append(client.evaluate().loss)
        outcomes.append(({k: v.float() for k, v in client.state().items()}, losses))
    (first, losses_a), (second, losses_b) = outcomes
    largest = max(float((first[k] - second[k]).abs().max()) for k in first)
    same = all(torch.equal(first[k], second[k]) for k in first)
    return f"| {str(deterministic).lower()} | {'yes' if same else 'no'} | {largest:.3g} | {losses_a == losses_b} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hospitals", type=int, default=3)
    parser.add_argument("--tiles", type=int, default=820, help="training tiles per hospital")
    parser.add_argument("--input-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = torch.device(args.device)
    config = load_config(ROOT / "configs" / "seed.toml")
    nhead = resolved_nhead(config)
    preset = recipe_from_config(
        config,
        head_epochs=config.client.head_epochs,
        fisher_batch=config.fedsaf.fisher_batch if config.fedsaf.fim else 0,
    )
    plain = Recipe(epochs=1, lr=0.01, momentum=0.9)
    hospitals = [tiles(args.tiles, args.input_size, seed) for seed in range(args.hospitals)]
    one = hospitals[0]
    bf16 = "bf16" if device.type == "cpu" or torch.cuda.is_bf16_supported() else "fp32"
    preset_batch = config.data.batch_size

    def train(client: Trainer, recipe: Recipe) -> Callable[[int], None]:
        def run(r: int) -> None:
            client.train(TrainInstruction(0, recipe), server_round=r, seed=r)

        return run

    def whole_round(batch: int, precision: str) -> Callable[[int], None]:
        clients = [product(h, device, batch, precision, preset, nhead, True) for h in hospitals]

        def run(r: int) -> None:
            for client in clients:
                client.train(TrainInstruction(0, preset), server_round=r, seed=r)
                client.evaluate()

        return run

    # (name, loop, training passes per timed call)
    phases = preset.head_epochs + preset.epochs
    Loop = tuple[str, Callable[[int], None], int]
    bare_same = f"bare, fp32, batch {preset_batch}"
    bare_fast = f"bare, {bf16} + channels-last, batch 256"
    against: dict[str, str] = {}  # each plain loop of the product -> the bare loop of its batch and precision

    def plain_loop(batch: int, precision: str, deterministic: bool = True, augment: bool = True) -> Loop:
        name = f"product, plain recipe, {precision}, batch {batch}"
        name += ("" if deterministic else ", deterministic off") + ("" if augment else ", augmentation off")
        against[name] = bare_same if precision == "fp32" else bare_fast
        client = product(one, device, batch, precision, plain, 0, deterministic, augment=augment)
        return name, train(client, plain), one.num_train

    def preset_loop(batch: int, precision: str, label: str, deterministic: bool = True) -> Loop:
        name = f"product, {label}, {precision}, batch {batch}" + ("" if deterministic else ", deterministic off")
        client = product(one, device, batch, precision, preset, nhead, deterministic)
        return name, train(client, preset), one.num_train * phases

    loops: list[Loop] = [
        (bare_same, bare_loop(one, device, preset_batch, False, channels_last=False), one.num_train),
        (bare_fast, bare_loop(one, device, 256, bf16 == "bf16", channels_last=True), one.num_train),
        (
            f"bare, fp32 + channels-last, batch {preset_batch}",
            bare_loop(one, device, preset_batch, False, channels_last=True),
            one.num_train,
        ),
        plain_loop(preset_batch, "fp32"),
        plain_loop(256, bf16),
        plain_loop(preset_batch, "fp32", deterministic=False),
        plain_loop(256, bf16, deterministic=False),
        plain_loop(preset_batch, "fp32", deterministic=False, augment=False),
        plain_loop(256, bf16, deterministic=False, augment=False),
        preset_loop(preset_batch, "fp32", "the preset (FedSAF)"),
        preset_loop(256, bf16, "the preset (FedSAF)"),
        preset_loop(preset_batch, "fp32", "the preset", deterministic=False),
        (
            f"product, a whole round of {args.hospitals} hospitals (train + evaluate), fp32, batch {preset_batch}",
            whole_round(preset_batch, "fp32"),
            sum(h.num_train for h in hospitals) * phases,
        ),
        (
            f"product, a whole round of {args.hospitals} hospitals (train + evaluate), {bf16}, batch 256",
            whole_round(256, bf16),
            sum(h.num_train for h in hospitals) * phases,
        ),
    ]
    for name, run, _ in loops:  # warm-up: allocator, cuDNN plans, first-call dispatch
        start = time.perf_counter()
        run(0)
        sync(device)
        print(f"warm-up {time.perf_counter() - start:6.1f} s  {name}", flush=True)
    times: dict[str, list[float]] = {name: [] for name, _, _ in loops}
    for r in range(1, args.repeats + 1):
        for name, run, _ in loops:
            sync(device)
            start = time.perf_counter()
            run(r)
            sync(device)
            times[name].append(time.perf_counter() - start)
            print(f"call {r}  {times[name][-1]:6.2f} s  {name}", flush=True)
    rate = {name: passes / statistics.median(times[name]) for name, _, passes in loops}
    rows = [
        f"| {name} | {statistics.median(times[name]):.3f} | {rate[name]:,.0f} | {rate[name] / rate[bare_fast]:.2f} |"
        for name, _, _ in loops
    ]
    same_precision = {name: rate[name] / rate[bare] for name, bare in against.items()}
    text = "\n".join(
        [
            "# Training throughput: the product's loop against a bare PyTorch loop",
            "",
            f"Command: `{command_line('gpu_throughput.py')}`",
            "",
            device_line(str(device)),
            "",
            f"Workload: {args.hospitals} hospitals x {args.tiles} synthetic RGB tiles of {args.input_size} px held on "
            f"the device as uint8, MobileNetV3-Small, SGD momentum 0.9; the preset is configs/seed.toml (FedSAF, "
            f"nhead {nhead}, head epoch + base epoch, precise BN, Fisher pass of {preset.fisher_batch} tiles, "
            f"augmentation on). Median of {args.repeats} timed calls after a warm-up, loops interleaved. passes/s = "
            "training tiles x epochs / seconds (a whole round's seconds include evaluating each hospital).",
            "",
            "| loop | median s | passes/s | ratio to the bare bf16 batch-256 loop |",
            "|---|---:|---:|---:|",
            *rows,
            "",
            "The product's plain loop against the bare loop at the same batch and precision: "
            + "; ".join(f"{name}: {ratio:.2f}" for name, ratio in same_precision.items())
            + ". The product's loop adds the H&E augmentation (8 symmetries, HSV and brightness/contrast per tile, "
            "on the device) that the bare loop's flips do not do, and by default deterministic kernels (cuDNN without "
            "autotuning, pooling as a mean), which the bare loop does not use: the rows with deterministic off and "
            "augmentation off take these away one at a time. On a GPU the product holds its model channels-last at "
            "either precision; the bare fp32 loop does not, and its channels-last row shows what that layout costs "
            "or saves in fp32.",
        ]
    )
    write_result(args.out, text + "\n")  # the timings are kept even if the determinism check below is cut short
    print(text, flush=True)
    determinism = [determinism_row(one, device, preset, nhead, on) for on in (True, False)]
    reproducibility = "\n".join(
        [
            "",
            "",
            "## Reproducibility",
            "",
            "The same hospital trained twice from the same seed with the preset's recipe (2 rounds of train + "
            "evaluate, fp32, batch 32), in one process:",
            "",
            "| run.deterministic | weights identical | largest weight difference | test losses identical |",
            "|---|---|---:|---|",
            *determinism,
            "",
        ]
    )
    print(reproducibility)
    write_result(args.out, text + reproducibility)


if __name__ == "__main__":
    main()
