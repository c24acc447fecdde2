"""The training path on a GPU (issue 32): a hospital's tiles held on the device as ``uint8``, H&E augmentation done
in batches on the device, bf16 autocast, channels-last, and deterministic kernels.

**Augmentation on the device** (`augment`) draws, per tile, from the same distributions as the CPU path's
albumentations pipeline (`federation.hospital.data.make_augmenter`), in the same order:

1. one of the 8 symmetries of the square (4 rotations by 90 degrees, each with or without a mirror), uniformly
   (albumentations' ``SquareSymmetry``, p = 1): tissue has no orientation;
2. with probability 0.5, a hue / saturation / value shift (``HueSaturationValue(8, 12, 8)``): shifts drawn
   uniformly from [-8, 8] hue steps of OpenCV's 8-bit HSV (180 steps to the circle, so +-16 degrees), [-12, 12] and
   [-8, 8] of 255 in saturation and value, added (hue around the circle, the others clipped); a gray tile gets the
   value shift only;
3. with probability 0.5, brightness and contrast (``RandomBrightnessContrast(0.1, 0.1)``): ``x * alpha + beta *
   255``, alpha uniform in [0.9, 1.1], beta uniform in [-0.1, 0.1], clipped to [0, 255].

The colour conversions are done in float on the device (not OpenCV's 8-bit lookup tables), so a tile is not
bit-identical to the CPU path's: the distributions are the same, and `tests/federation/test_gpu_path.py` checks
them on a seeded batch. Every draw comes from one ``torch.Generator`` on the device, seeded per round.

**Determinism** (`make_deterministic`, ``run.deterministic``, on by default): ``torch.use_deterministic_algorithms``,
cuBLAS's fixed workspace (``CUBLAS_WORKSPACE_CONFIG=:4096:8``), cuDNN without autotuning, and every global average
pooling of the model (MobileNetV3's squeeze-excitation blocks and its head) written as a mean: the backward of
CUDA's adaptive average pooling has no deterministic kernel, a mean's has. The weights and ``state_dict`` keys do
not change. On the CPU nothing is changed: its kernels are deterministic already.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from federation.errors import FederationError

HUE_STEPS = 180.0  # OpenCV's 8-bit hue: 180 steps to the circle
HUE_SHIFT, SAT_SHIFT, VAL_SHIFT, HSV_P = 8.0, 12.0, 8.0, 0.5
BRIGHTNESS, CONTRAST, BC_P = 0.1, 0.1, 0.5
CUBLAS_WORKSPACE = ":4096:8"
EPOCH_CHUNK = 1024  # tiles augmented at once when an epoch's tiles are augmented ahead (bounds the float copies)


def _uniform(n: int, limit: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return (torch.rand(n, generator=generator, device=device) * 2.0 - 1.0) * limit


def _as_swaps_and_flips(code: int) -> tuple[bool, bool, bool]:
    """Symmetry ``code`` (``k = code % 4`` quarter turns of the tile mirrored left-right when ``code >= 4``) as
    (swap height and width, flip height, flip width), applied in that order: every symmetry of the square is one."""
    probe = torch.arange(9).view(3, 3)
    wanted = torch.rot90(torch.flip(probe, dims=(1,)) if code >= 4 else probe, k=code % 4, dims=(0, 1))
    for swap in (False, True):
        for flip_h in (False, True):
            for flip_w in (False, True):
                x = probe.t() if swap else probe
                x = x.flip(0) if flip_h else x
                x = x.flip(1) if flip_w else x
                if torch.equal(x, wanted):
                    return swap, flip_h, flip_w
    raise AssertionError(f"symmetry {code} is not a swap and flips")  # pragma: no cover: the group has 8


SWAPS_AND_FLIPS = torch.tensor([_as_swaps_and_flips(code) for code in range(8)])  # (8, 3) bool


def symmetries(images: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    """Each tile of ``images`` (B, S, S, C) under one of the 8 symmetries of the square: ``which`` (B,) in 0..7,
    ``k = which % 4`` quarter turns, mirrored (left-right, before turning) when ``which >= 4``. Three whole-batch
    steps (swap height and width, flip height, flip width, each where the symmetry needs it), not one per code."""
    if images.shape[1] != images.shape[2]:
        raise ValueError(f"tiles must be square, got {tuple(images.shape[1:3])}")
    steps = SWAPS_AND_FLIPS.to(which.device)[which]
    x = images
    for column, move in enumerate((lambda t: t.transpose(1, 2), lambda t: t.flip(1), lambda t: t.flip(2))):
        x = torch.where(steps[:, column].view(-1, 1, 1, 1), move(x), x)
    return x


def rgb_to_hsv(rgb: torch.Tensor) -> torch.Tensor:
    """(..., 3) RGB in [0, 1] -> (..., 3) HSV: hue in [0, 1) of the circle, saturation and value in [0, 1]."""
    r, g, b = rgb.unbind(-1)
    value, _ = rgb.max(-1)
    low, _ = rgb.min(-1)
    span = value - low
    safe = torch.where(span > 0, span, torch.ones_like(span))
    hue = torch.where(value == r, (g - b) / safe, torch.where(value == g, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = torch.where(span > 0, (hue / 6.0) % 1.0, torch.zeros_like(hue))
    saturation = torch.where(value > 0, span / torch.where(value > 0, value, torch.ones_like(value)), value * 0)
    return torch.stack([hue, saturation, value], -1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """The inverse of `rgb_to_hsv`."""
    hue, saturation, value = hsv.unbind(-1)
    k = torch.stack([(5.0 + hue * 6.0) % 6.0, (3.0 + hue * 6.0) % 6.0, (1.0 + hue * 6.0) % 6.0], -1)
    ramp = torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)
    return value.unsqueeze(-1) - (value * saturation).unsqueeze(-1) * ramp


@dataclass(frozen=True)
class Draws:
    """One batch's random draws, one value per tile (the module docstring's distributions): ``which`` symmetry
    (0..7), whether the HSV shift applies (``hsv_on``) and its ``hue``, ``sat``, ``val`` shifts, whether brightness
    and contrast apply (``bc_on``) and their ``alpha`` and ``beta``."""

    which: torch.Tensor
    hsv_on: torch.Tensor
    hue: torch.Tensor
    sat: torch.Tensor
    val: torch.Tensor
    bc_on: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor


def draw(n: int, generator: torch.Generator, device: torch.device) -> Draws:
    """The draws for ``n`` tiles, in a fixed order from ``generator``."""
    which = torch.randint(0, 8, (n,), generator=generator, device=device)
    hsv_on = torch.rand(n, generator=generator, device=device) < HSV_P
    hue = _uniform(n, HUE_SHIFT, generator, device)
    sat = _uniform(n, SAT_SHIFT, generator, device)
    val = _uniform(n, VAL_SHIFT, generator, device)
    bc_on = torch.rand(n, generator=generator, device=device) < BC_P
    alpha = 1.0 + _uniform(n, CONTRAST, generator, device)
    beta = _uniform(n, BRIGHTNESS, generator, device)
    return Draws(which, hsv_on, hue, sat, val, bc_on, alpha, beta)


def apply(images: torch.Tensor, d: Draws) -> torch.Tensor:
    """``images`` (``uint8`` (B, S, S, C)) under the draws ``d``: symmetry, then the HSV shift, then brightness and
    contrast, each where drawn; ``uint8`` out (rounded)."""
    n, channels = images.shape[0], images.shape[3]
    x = symmetries(images, d.which).float()
    per_tile = (n, 1, 1, 1)
    if channels == 3:
        hsv = rgb_to_hsv(x / 255.0)
        shape = (n, 1, 1)
        shifted = torch.stack(
            [
                (hsv[..., 0] + (d.hue / HUE_STEPS).view(shape)) % 1.0,
                (hsv[..., 1] + (d.sat / 255.0).view(shape)).clamp(0.0, 1.0),
                (hsv[..., 2] + (d.val / 255.0).view(shape)).clamp(0.0, 1.0),
            ],
            -1,
        )
        coloured = hsv_to_rgb(shifted) * 255.0
    else:  # a gray tile: the value shift only
        coloured = (x + d.val.view(per_tile)).clamp(0.0, 255.0)
    x = torch.where(d.hsv_on.view(per_tile), coloured, x)
    adjusted = (x * d.alpha.view(per_tile) + (d.beta * 255.0).view(per_tile)).clamp(0.0, 255.0)
    x = torch.where(d.bc_on.view(per_tile), adjusted, x)
    return x.round().to(torch.uint8)


def augment(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The module docstring's augmentation of a ``uint8`` (B, S, S, C) batch on its device; ``uint8`` out."""
    return apply(images, draw(images.shape[0], generator, images.device))


@functools.lru_cache(maxsize=16)
def _stats_on(
    device: torch.device, mean: tuple[float, ...], std: tuple[float, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel ``mean`` and ``std`` as (1, 1, 1, C) tensors on ``device``, made once per process: a tensor
    built from a Python list is copied to the GPU by a blocking copy, which waits until the GPU has finished every
    kernel queued before it, so building them at every step would stall the host at every step."""
    channels = len(mean)
    return (
        torch.tensor(mean, device=device).view(1, 1, 1, channels),
        torch.tensor(std, device=device).view(1, 1, 1, channels),
    )


def normalise(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``uint8`` (B, S, S, C) on the device -> ``float32`` (B, C, S, S) in channels-last memory: ``(x / 255 - mean)
    / std`` per channel, as `models.preprocess.normalise` computes it on the CPU."""
    if len(mean) != images.shape[3] or len(std) != images.shape[3]:
        raise ValueError(f"{images.shape[3]} channels but {len(mean)} means and {len(std)} standard deviations")
    mean_t, std_t = _stats_on(images.device, tuple(float(m) for m in mean), tuple(float(d) for d in std))
    x = images.float().div_(255.0).sub_(mean_t).div_(std_t)
    return x.permute(0, 3, 1, 2)  # (B, C, S, S) over NHWC memory: channels-last


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast of the forward pass and loss for ``precision = "bf16"``; nothing for ``"fp32"``."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def check_precision(device: torch.device, precision: str) -> None:
    """`FederationError` (one line) for bf16 on a GPU without bf16."""
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise FederationError("run.precision = bf16 but this GPU has no bf16: use run.precision = fp32")


class GlobalMean(nn.Module):
    """Global average pooling as a mean over height and width (``AdaptiveAvgPool2d(1)``'s forward; a deterministic
    backward on CUDA)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, 1, 1)."""
        return x.mean(dim=(2, 3), keepdim=True)


def _global_pools(model: nn.Module) -> Iterator[tuple[nn.Module, str]]:
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.AdaptiveAvgPool2d) and child.output_size in (1, (1, 1)):
                yield parent, name


def mean_pools(model: nn.Module) -> int:
    """Every global average pooling of ``model`` (``AdaptiveAvgPool2d(1)``) replaced by `GlobalMean`; how many."""
    found = list(_global_pools(model))
    for parent, name in found:
        setattr(parent, name, GlobalMean())
    return len(found)


def kernels(device: torch.device, deterministic: bool) -> None:
    """Put torch's process-wide kernel choice for ``device`` in the mode a client trains in: deterministic
    (``use_deterministic_algorithms``, cuBLAS's fixed workspace, cuDNN without autotuning) or fast (cuDNN
    autotuning). Called before each round's training, since several clients may share a process. On the CPU
    nothing is changed."""
    if device.type != "cuda":
        return
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic


def make_deterministic(model: nn.Module, device: torch.device) -> int:
    """Deterministic kernels for training ``model`` on ``device`` (the module docstring); returns how many pooling
    layers became a mean. On the CPU nothing is changed (0)."""
    if device.type != "cuda":
        return 0
    kernels(device, True)
    return mean_pools(model)
