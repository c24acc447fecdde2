"""Where a hospital's batches come from: its tiles in memory (the CPU path) or held on the GPU (the device path).

On the CPU each batch is cut from the ``uint8`` tiles in memory, augmented per tile with albumentations
(`federation.hospital.data.make_augmenter`) and normalised into a ``float32`` tensor (`to_tensor`).

On a GPU (`federation.hospital.gpu`, issue 32) the tiles of a split are uploaded once as ``uint8`` and kept there
(`BatchSource.held`); batches are augmented and normalised on the device (the same distributions as the CPU path's
albumentations), from a generator on the device seeded like the CPU path's augmenter (`BatchSource.start_round`). A
training epoch's tiles are augmented ahead, in chunks (`BatchSource.device_epoch`), rather than per step.

Every draw of a round's augmentation comes from the round's seed, so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import albumentations as A
import numpy as np
import torch

from federation.hospital import gpu
from federation.hospital.data import HospitalData, augment_batch, make_augmenter, to_tensor
from models.preprocess import default_stats

Batch = tuple[torch.Tensor, torch.Tensor]  # normalised tiles (B, C, S, S) and their labels (B,), on the device


def fold_batches(order: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``order`` cut into batches of ``batch_size`` indices; a last batch of one index is folded into the one
    before (a batch of one sample makes BatchNorm fail in train mode)."""
    chunks = list(torch.split(order, batch_size))
    if len(chunks) > 1 and chunks[-1].numel() == 1:
        chunks[-2] = torch.cat([chunks[-2], chunks[-1]])
        chunks.pop()
    return chunks


class BatchSource:
    """A hospital's tiles as batches on ``device``: the CPU path, or the device path when ``on_gpu`` (a CUDA
    ``device``; tests set ``on_gpu`` to run the device path on the CPU's tensors). ``augment``: whether training
    tiles are augmented (``data.augment``)."""

    def __init__(self, data: HospitalData, device: torch.device, augment: bool) -> None:
        self.data = data
        self.device = device
        self.augment = augment
        self.on_gpu = device.type == "cuda"
        self._held: dict[str, torch.Tensor] = {}  # the tiles on the GPU (uint8), by split
        self._stats = default_stats(int(data.train_x.shape[3]))
        self._device_generator: torch.Generator | None = None
        self._augmenter: A.Compose | None = None

    def start_round(self, seed: int, deterministic: bool) -> None:
        """Seed the round's augmentation: the CPU path's albumentations pipeline, or (device path) the generator
        on the device the device path's augmentation draws from, seeded alike, with the device's kernels set to
        deterministic ones unless ``deterministic`` is false (`gpu.kernels`)."""
        self._augmenter = make_augmenter(seed) if self.augment and not self.on_gpu else None
        if self.on_gpu:
            gpu.kernels(self.device, deterministic)
            self._device_generator = torch.Generator(device=self.device).manual_seed(seed)

    # -- training --------------------------------------------------------------------------------------------------
    def epoch(self, order: torch.Tensor, batches: Sequence[torch.Tensor]) -> Iterator[Batch]:
        """One training epoch's batches (``batches``: ``order`` cut by `fold_batches`), augmented when the hospital
        augments. On the device path the epoch's tiles are augmented at once, before the first batch
        (`device_epoch`), and each batch is a slice of them; on the CPU each batch is augmented as it is asked for."""
        ahead = self.device_epoch(order) if self.on_gpu else None
        return self._epoch(batches, ahead)

    def _epoch(self, batches: Sequence[torch.Tensor], ahead: Batch | None) -> Iterator[Batch]:
        images, labels = self.data.train_x, torch.from_numpy(self.data.train_y)
        start = 0
        for index in batches:
            if ahead is not None:  # the epoch's tiles, augmented at once on the device: a slice per step
                end = start + index.numel()
                yield gpu.normalise(ahead[0][start:end], *self._stats), ahead[1][start:end]
                start = end
            else:
                yield self._augmented(images, index), labels[index].to(self.device)

    def train_tiles(self, index: torch.Tensor) -> torch.Tensor:
        """Training tiles ``index``, augmented when the hospital augments (on the device path from the device
        generator), normalised: one DP-SGD unit's tiles (`federation.hospital.dp_sgd`)."""
        if self.on_gpu:  # augmented on the device like the plain path's tiles
            return self.device_batch("train", index, self.augment)[0]
        return self._augmented(self.data.train_x, index)

    def _augmented(self, images: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        batch = images[index.numpy()]
        if self._augmenter is not None:
            batch = augment_batch(self._augmenter, batch)
        return to_tensor(batch, self.device)

    # -- un-augmented ------------------------------------------------------------------------------------------------
    def split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The ``split``'s tiles (``uint8``) and labels: ``train``, ``val`` (`ValueError` without one) or ``test``."""
        if split == "train":
            return self.data.train_x, self.data.train_y
        if split == "val":
            if self.data.val_x is None or self.data.val_y is None:
                raise ValueError(f"hospital {self.data.hospital} has no validation split")
            return self.data.val_x, self.data.val_y
        return self.data.test_x, self.data.test_y

    def plain(self, split: str, start: int, stop: int) -> Batch:
        """Tiles ``start:stop`` of ``split``, not augmented, normalised, with their labels (evaluation, precise BN)."""
        if self.on_gpu:
            return self.device_batch(split, torch.arange(start, stop))
        images, labels = self.split(split)
        return to_tensor(images[start:stop], self.device), torch.from_numpy(labels[start:stop]).to(self.device)

    # -- the device path ---------------------------------------------------------------------------------------------
    def held(self, split: str) -> Batch:
        """The ``split``'s tiles (``uint8``) and labels on the GPU, uploaded once."""
        if split not in self._held:
            images, labels = self.split(split)
            self._held[split] = torch.from_numpy(np.ascontiguousarray(images)).to(self.device)
            self._held[f"{split}_y"] = torch.from_numpy(labels).to(self.device)
        return self._held[split], self._held[f"{split}_y"]

    def device_epoch(self, order: torch.Tensor) -> Batch:
        """The training tiles in ``order`` on the GPU (``uint8``), augmented there when the hospital augments, and
        their labels: one epoch's augmentation done in chunks of `gpu.EPOCH_CHUNK` tiles rather than per step, so a
        small batch does not pay the augmentation's kernel launches every step. Each tile's draws follow the same
        distributions (`federation.hospital.gpu`); they come from the round's device generator in the epoch's
        order."""
        images, labels = self.held("train")
        order = order.to(self.device)
        tiles = images.index_select(0, order)
        if self.augment:
            assert self._device_generator is not None
            tiles = torch.cat([gpu.augment(c, self._device_generator) for c in tiles.split(gpu.EPOCH_CHUNK)])
        return tiles, labels.index_select(0, order)

    def device_batch(self, split: str, index: torch.Tensor, augment: bool = False) -> Batch:
        """Tiles ``index`` of ``split`` from the GPU, augmented there when ``augment``, normalised in channels-last
        memory, with their labels."""
        images, labels = self.held(split)
        index = index.to(self.device)
        batch = images.index_select(0, index)
        if augment:
            assert self._device_generator is not None
            batch = gpu.augment(batch, self._device_generator)
        return gpu.normalise(batch, *self._stats), labels.index_select(0, index)
