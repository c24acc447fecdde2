"""Whether the hospitals that share one GPU fit in its memory, checked before they start (issue 32).

With ``run.workers = W`` on a GPU, W processes share the device; each holds the tiles of its hospitals (every split,
``uint8``, `federation.hospital.batches.BatchSource.held`), their models, and trains one hospital at a time. Before
the
workers start, `check_shared_gpu` estimates each process's need and compares the sum with the device's free memory
(``torch.cuda.mem_get_info``); a run that would not fit is refused in one line naming the figures and how many
workers do fit, instead of failing a round later with CUDA's out-of-memory message.

Each process's estimate (`process_bytes`) is the sum of

* ``CONTEXT_BYTES``: a CUDA context with its cuBLAS and cuDNN workspaces, and what the caching allocator keeps
  between training, the Fisher pass and evaluation (1.75 GiB: one training process on an H200 with torch 2.11 held
  2.23 GiB where the rest of the estimate came to 0.49 GiB; `benchmarks/gpu_memory.py`);
* the tiles it holds: tiles x S x S x C bytes;
* per hospital, its model's parameters four times over (weights, gradients, momentum and the shared copy);
* the activations of one training batch (of the batch size, or of its largest hospital's tiles if fewer): the
  bytes autograd saves for the backward pass, measured once on the CPU with
  ``torch.autograd.graph.saved_tensors_hooks`` (`activation_bytes`) at the run's input size and scaled to the
  batch, the same in bf16 (an upper bound there);

times ``ALLOCATOR_SLACK`` for the caching allocator's rounding and fragmentation. `benchmarks/gpu_memory.py`
compares the estimate with the peak that ``nvidia-smi`` reads on a real GPU: it matched one process and asked for
1.4 times what five fp32 workers held and twice what five bf16 workers held, so it refuses early rather than late.
``run.check_gpu_memory = false`` skips it (a run that then does not fit fails with CUDA's out-of-memory error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from federation.config import RunConfig
from federation.derived import resolve_device
from federation.errors import FederationError
from federation.hospital.data import read_manifest

CONTEXT_BYTES = 1792 * 2**20  # 1.75 GiB: measured on an H200, torch 2.11 (benchmarks/results/gpu_memory.md)
ALLOCATOR_SLACK = 1.25
_PROBE_BATCH = 2
# The refusals' last words: the estimate errs high (bf16 above all), and whoever knows better may skip it.
OVERRIDE = " (the estimate errs high: --set run.check_gpu_memory=false runs them anyway)"


@lru_cache(maxsize=16)
def activation_bytes(model_name: str, input_size: int, channels: int) -> int:
    """Bytes autograd saves in one training forward pass of one tile of ``input_size`` px (a batch of 2, halved):
    each saved tensor's storage counted once, the model's own weights left out."""
    from models import create_model

    model = create_model(model_name, in_chans=channels)
    model.train()
    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:  # the weights autograd keeps are counted in parameter_bytes
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.zeros(_PROBE_BATCH, channels, input_size, input_size)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    return -(-sum(seen.values()) // _PROBE_BATCH)


@lru_cache(maxsize=16)
def parameter_bytes(model_name: str, channels: int) -> int:
    """Bytes of one model's parameters and buffers (``float32``)."""
    from models import create_model

    model = create_model(model_name, in_chans=channels)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@dataclass(frozen=True)
class Shape:
    """What sizes a hospital's training on the GPU, besides its tiles: the run's input size, channels, batch size
    and model."""

    input_size: int
    channels: int
    batch_size: int
    model_name: str

    @classmethod
    def of(cls, config: RunConfig) -> Shape:
        """The shape of a run of ``config``."""
        return cls(config.data.input_size, config.model.in_chans, config.data.batch_size, config.model.name)


def process_bytes(tiles: Sequence[int], shape: Shape) -> int:
    """The estimate of the module docstring for one process holding hospitals of ``tiles`` tiles each."""
    held = sum(tiles) * shape.input_size * shape.input_size * shape.channels
    models = len(tiles) * 4 * parameter_bytes(shape.model_name, shape.channels)
    batch = min(shape.batch_size, max(tiles, default=0))  # one hospital trains at a time, in batches of its tiles
    activations = batch * activation_bytes(shape.model_name, shape.input_size, shape.channels)
    return CONTEXT_BYTES + int(ALLOCATOR_SLACK * (held + models + activations))


def spread(tiles: Sequence[int], workers: int) -> list[list[int]]:
    """``tiles`` (one count per hospital, in the federation's order) over ``workers`` processes round-robin, as
    `federation.engine.pools.WorkerPool` places the hospitals."""
    workers = max(1, min(workers, len(tiles)))
    return [list(tiles[w::workers]) for w in range(workers)]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def run_bytes(tiles: Sequence[int], workers: int, shape: Shape) -> int:
    """The estimate for a run whose hospitals of ``tiles`` tiles each are spread over ``workers`` processes (0: one
    process holds them all)."""
    return sum(process_bytes(group, shape) for group in spread(tiles, max(workers, 1)))


def check_shared_gpu(tiles: Sequence[int], workers: int, free_bytes: int, shape: Shape) -> int:
    """`FederationError` (one line) when ``workers`` processes holding hospitals of ``tiles`` tiles each need more
    than ``free_bytes``; the estimated need otherwise. The message names the largest number of workers that fits."""
    wanted = run_bytes(tiles, workers, shape)
    if wanted <= free_bytes:
        return wanted
    fitting = [w for w in range(1, workers) if run_bytes(tiles, w, shape) <= free_bytes]
    advice = (
        f"use run.workers = {fitting[-1]}"
        if fitting
        else "even one worker does not fit: lower data.batch_size or data.input_size, or free the GPU"
    )
    raise FederationError(
        f"run.workers = {workers}: the hospitals would need about {_gib(wanted)} of GPU memory at once and "
        f"{_gib(free_bytes)} is free; {advice}{OVERRIDE}"
    )


def check_cells(needs: Sequence[int], at_once: int, free_bytes: int) -> int:
    """`FederationError` (one line) when the ``at_once`` largest of the cells' estimated ``needs`` (`config_bytes`
    of each cell) exceed ``free_bytes`` of the one GPU they share; their sum otherwise. Names the ``--workers`` that
    fits."""
    largest = sorted(needs, reverse=True)
    wanted = sum(largest[:at_once])
    if wanted <= free_bytes:
        return wanted
    fitting = [k for k in range(1, at_once) if sum(largest[:k]) <= free_bytes]
    advice = (
        f"use --workers {fitting[-1]}"
        if fitting
        else "even one cell does not fit: lower data.batch_size or data.input_size, or free the GPU"
    )
    raise FederationError(
        f"--workers {at_once}: the cells sharing the GPU would need about {_gib(wanted)} of its memory at once and "
        f"{_gib(free_bytes)} is free; {advice}{OVERRIDE}"
    )


def hospital_tiles(dataset: str | Path) -> dict[int, int]:
    """Tiles per hospital of a prepared dataset, every split (what a hospital holds on the GPU)."""
    counts: dict[int, int] = {}
    for row in read_manifest(dataset):
        counts[row.hospital] = counts.get(row.hospital, 0) + 1
    return counts


def config_bytes(config: RunConfig, counts: Mapping[int, int]) -> int:
    """`run_bytes` of a run of ``config`` over every hospital of its dataset (``counts``: `hospital_tiles` of it),
    spread over its ``run.workers``."""
    return run_bytes([counts[h] for h in sorted(counts)], config.run.workers, Shape.of(config))


def free_gpu_bytes(device: torch.device | str = "cuda") -> int:
    """The device's free memory now (``torch.cuda.mem_get_info``)."""
    return int(torch.cuda.mem_get_info(device)[0])


def check_workers_fit(config: RunConfig, data_indices: Sequence[int]) -> None:
    """On a GPU, refuse ``run.workers`` processes whose hospitals (their rows ``data_indices`` of ``data.path``)
    would not fit in its free memory, before the run starts; nothing on the CPU or with
    ``run.check_gpu_memory = false``."""
    device = resolve_device(config.run.device)
    if device.type != "cuda" or not config.run.check_gpu_memory:
        return
    counts = hospital_tiles(config.data.path)
    tiles = [counts.get(index, 0) for index in data_indices]
    free = free_gpu_bytes(device)
    check_shared_gpu(tiles, config.run.workers, free, Shape.of(config))
