"""The statistics a tissue description (`models.shift`) is made of, read from a network as it scores tiles.

A forward hook (PyTorch's ``register_forward_hook``) on one layer records, for each tile of a batch, three statistics of
every channel of that layer's output over the tile's positions: mean, log standard deviation, and the log mean absolute
difference between horizontally and vertically neighbouring positions (how fine the texture is). The layer is the
network's first layer unit (`models.split_units`: MobileNetV3-Small's stem ``features.0``, ResNet's ``conv1``, a timm
model's stem), where colour, contrast and the scale of the texture still show; why that layer is in `models.shift`.
With ``scale`` (descriptions from version 2, `models.shift`) each tile also gets, per channel of the network's input,
`scale_ratio`: the log ratio of the mean absolute change between positions two apart to that between neighbours,
which rises towards log 2 when the tissue is enlarged (a smoother image changes about twice as much over twice the
distance) and does not depend on the stain's intensity (both changes scale with it).
`LayerStatistics` lets the same forward pass that gives the tile probabilities give the statistics (``predict`` pays no
second pass); `tile_statistics` stops each pass at the layer (the export describes a hospital's tiles without running
the rest of the network).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from models.errors import ModelError
from models.split import split_units

LOG_FLOOR = 1e-3  # added before the logarithm: a channel that is flat over a tile (std 0) stays finite


class _Reached(Exception):
    """Raised by the hook to end a forward pass once the layer has been read (`tile_statistics`)."""


def description_layer(model: nn.Module) -> str:
    """The module path of the network's first layer unit (for a unit of several modules, ``conv_stem+bn1``, its
    last one)."""
    name = split_units(model)[0][0].split("+")[-1]
    if name not in dict(model.named_modules()):
        raise ModelError(f"the first layer unit {name!r} is not a module of {type(model).__name__}")
    return name


def _change(maps: torch.Tensor, step: int) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, C)``: mean absolute change between positions ``step`` apart, across and down,
    averaged."""
    across = (maps[:, :, :, step:] - maps[:, :, :, :-step]).abs().mean(dim=(2, 3))
    down = (maps[:, :, step:, :] - maps[:, :, :-step, :]).abs().mean(dim=(2, 3))
    return (across + down) / 2


def scale_ratio(images: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, C)`` float64: ``log(c2 + f) - log(c1 + f)`` per channel, ``c_d`` the mean absolute
    change between positions ``d`` apart (`_change`), ``f`` = `LOG_FLOOR`. Fine texture (neighbours already as
    different as any two positions) gives about 0; a smooth, enlarged image about log 2."""
    maps = images.detach().float()
    return (torch.log(_change(maps, 2) + LOG_FLOOR) - torch.log(_change(maps, 1) + LOG_FLOOR)).double()


def channel_statistics(output: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` activations -> ``(B, 3C)``: each channel's mean, log standard deviation, then log mean
    absolute change between neighbouring positions (across and down, averaged), over the positions (computed in
    float32, returned as float64). Pooled features (``(B, C)`` or one position) are returned as they are
    (``(B, C)``)."""
    maps = output.detach().float()
    if maps.dim() == 2 or maps[0, 0].numel() == 1:  # already pooled (B, C) or (B, C, 1, 1): the values themselves
        return maps.flatten(1).double()
    std, mean = torch.std_mean(maps, dim=(2, 3), correction=0)
    # the spread and the change as logarithms: their ratio, how fine the texture is for its contrast (what an
    # enlarged slide changes), is then a difference, which a Mahalanobis distance weighs linearly
    change = _change(maps, 1)
    return torch.cat([mean, torch.log(std + LOG_FLOOR), torch.log(change + LOG_FLOOR)], dim=1).double()


class LayerStatistics:
    """Collects `channel_statistics` of ``layer`` for every forward pass while active (`capture`), followed, with
    ``scale``, by the `scale_ratio` of the network's input."""

    def __init__(self, model: nn.Module, layer: str, *, stop: bool = False, scale: bool = False) -> None:
        modules = dict(model.named_modules())
        if layer not in modules:
            raise ModelError(f"layer {layer!r} is not a module of {type(model).__name__}")
        self.model = model
        self.module = modules[layer]
        self.stop = stop
        self.scale = scale
        self.rows: list[npt.NDArray[np.float64]] = []
        self._input: torch.Tensor | None = None

    def _input_hook(self, module: nn.Module, inputs: Any) -> None:
        self._input = scale_ratio(inputs[0])

    def _hook(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        stats = channel_statistics(output)
        if self.scale:
            assert self._input is not None  # the model's pre-hook ran first in this pass
            stats = torch.cat([stats, self._input.to(stats.device)], dim=1)
            self._input = None
        self.rows.append(stats.cpu().numpy())
        if self.stop:
            raise _Reached

    @contextmanager
    def capture(self) -> Iterator[LayerStatistics]:
        """Record while the block runs; the hooks are removed on leaving."""
        handles = [self.module.register_forward_hook(self._hook)]
        if self.scale:
            handles.append(self.model.register_forward_pre_hook(self._input_hook))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def take(self) -> npt.NDArray[np.float64]:
        """Everything recorded so far, one row per tile, and forget it."""
        out = np.concatenate(self.rows) if self.rows else np.empty((0, 0), dtype=np.float64)
        self.rows = []
        return out


def tile_statistics(
    model: nn.Module, layer: str, batches: Iterator[torch.Tensor] | list[torch.Tensor], *, scale: bool = False
) -> npt.NDArray[np.float64]:
    """`channel_statistics` of ``layer`` (and with ``scale`` the input's `scale_ratio`) for every tile of
    ``batches`` (normalised input tensors), the model in eval mode, each pass stopped at the layer."""
    stats = LayerStatistics(model, layer, stop=True, scale=scale)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), stats.capture():
            for batch in batches:
                with suppress(_Reached):
                    model(batch)
    finally:
        model.train(was_training)
    return stats.take()
