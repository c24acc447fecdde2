"""From tile pixels to the model's input tensor: the one preprocessing that training, evaluation and inference share.

timm's idea of a *data config* that travels with a model (``resolve_data_config``: input size, interpolation,
mean, std), applied to the FedSAF data processing (paper 001, Sec. 4.2 and 4.3.1):

1. **Tile pixels.** ``gastric-fl prepare`` cuts a square of ``round(tile_px / scale)`` slide pixels, resizes it to
   ``tile_px`` and, for a grayscale hospital, converts it to gray (`pipeline.tiling`); it stores that as a PNG.
   `tile_from_decoded` turns a decoded PNG (OpenCV's BGR/BGRA/gray, 8 or 16 bit) back into those RGB or gray
   ``uint8`` pixels; `predict` gets the same pixels straight from the slide, without the PNG round trip (PNG
   is lossless).
2. **Model input** (`Preprocess.fit`, `fit_tile`): channel handling, then a resize to ``input_size``
   (``INTER_AREA`` when shrinking, ``INTER_LINEAR`` when enlarging, as in prepare). With ``in_chans == 3``
   a gray tile is replicated to three identical channels (one architecture for gray and colour hospitals, so
   every layer can be shared); with ``in_chans == 1`` a colour tile is converted to gray.
3. **Normalisation** (`normalise`): ``uint8`` (B, S, S, C) -> ``float32`` (B, C, S, S) in [0, 1], minus ``mean``,
   divided by ``std`` (ImageNet statistics by default, the conventional scaling for these torchvision
   architectures; one gray value for ``in_chans == 1``).

`Preprocess` records all of it, plus where the tiles came from (tile size, scanning scale, gray hospital), so a
model's card (`models.bundle`) carries the exact preprocessing its weights were trained with.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import torch

from models.errors import ModelError

IMAGENET_MEAN_RGB: tuple[float, ...] = (0.485, 0.456, 0.406)
IMAGENET_STD_RGB: tuple[float, ...] = (0.229, 0.224, 0.225)
# One channel: the mean of the three (what a gray conversion of ImageNet statistics gives, to 3 decimals).
IMAGENET_MEAN_GRAY: tuple[float, ...] = (0.449,)
IMAGENET_STD_GRAY: tuple[float, ...] = (0.226,)
RESIZE_RULE = "cv2 INTER_AREA when shrinking, INTER_LINEAR when enlarging"

Pixels = npt.NDArray[np.uint8]


def default_stats(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(mean, std)`` for ``channels`` input channels: ImageNet's RGB statistics, or their gray counterpart."""
    if channels == 3:
        return IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
    if channels == 1:
        return IMAGENET_MEAN_GRAY, IMAGENET_STD_GRAY
    raise ModelError(f"in_chans must be 1 or 3, got {channels}")


def tile_from_decoded(image: npt.NDArray[Any]) -> Pixels:
    """A tile as ``cv2.imdecode(..., IMREAD_UNCHANGED)`` returns it -> RGB (H, W, 3) or gray (H, W) ``uint8``.

    16-bit samples are scaled to 0..255 by the tile's maximum, an alpha channel is dropped (prepare never writes
    one), and OpenCV's BGR order becomes RGB, the order `pipeline` keeps slides in.
    """
    if image.dtype != np.uint8:
        image = cv2.convertScaleAbs(image, alpha=255.0 / max(1.0, float(image.max())))
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim == 3 and image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_BGRA2BGR)
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    return np.asarray(image, dtype=np.uint8)


def fit_tile(tile: Pixels, input_size: int, in_chans: int) -> Pixels:
    """RGB (H, W, 3) or gray (H, W) ``uint8`` tile -> ``uint8`` (input_size, input_size, in_chans) model input.

    Channels first (gray for ``in_chans == 1``), then the resize, then gray replicated to three channels for
    ``in_chans == 3``: the order `federation.hospital.data` has always used, so stored tiles give the same arrays.
    """
    image: npt.NDArray[Any] = tile
    if image.ndim == 3 and in_chans == 1:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    if image.shape[0] != input_size or image.shape[1] != input_size:
        shrink = image.shape[0] > input_size
        image = cv2.resize(
            image, (input_size, input_size), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        )
    if image.ndim == 2:
        image = image[:, :, None]
        if in_chans == 3:
            image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image, dtype=np.uint8)


def normalise(
    images: Pixels, mean: tuple[float, ...], std: tuple[float, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``uint8`` (B, S, S, C) -> ``float32`` (B, C, S, S) on ``device``: ``(x / 255 - mean) / std`` per channel."""
    channels = images.shape[3]
    if len(mean) != channels or len(std) != channels:
        raise ModelError(f"normalisation has {len(mean)} mean / {len(std)} std values for {channels}-channel tiles")
    mean_t = torch.tensor(mean, device=device).view(1, channels, 1, 1)
    std_t = torch.tensor(std, device=device).view(1, channels, 1, 1)
    batch = torch.from_numpy(np.ascontiguousarray(images)).to(device).permute(0, 3, 1, 2).float().div_(255.0)
    return batch.sub_(mean_t).div_(std_t).contiguous()


# What a card's preprocessing may say: an input side a network of this version takes (the federation's data.input_size
# starts at 16) and a normalisation of pixel values scaled to 0-1 (a std of 1e-30 would blow every input up).
MIN_INPUT_SIZE, MAX_INPUT_SIZE = 16, 4096
STD_RANGE = (0.01, 10.0)


@dataclass(frozen=True)
class Preprocess:
    """A model's preprocessing from tile to tensor (timm's data config), as recorded in its card.

    ``tile_px``: the tile side prepare wrote for this hospital; ``scale``: its scanning scale (a tile covers
    ``round(tile_px / scale)`` slide pixels); ``grayscale``: the hospital's tiles are gray. ``input_size`` and
    ``in_chans``: what the network takes; ``mean``/``std``: the normalisation (default ImageNet, `default_stats`).
    ``tile_px``/``scale`` are ``None`` for a dataset without ``prepare.json`` (then only tiles can be scored).
    """

    input_size: int
    in_chans: int = 3
    tile_px: int | None = None
    scale: float | None = None
    grayscale: bool = False
    mean: tuple[float, ...] = field(default=())
    std: tuple[float, ...] = field(default=())
    resize: str = RESIZE_RULE

    def __post_init__(self) -> None:
        if self.in_chans not in (1, 3):
            raise ModelError(f"in_chans must be 1 or 3, got {self.in_chans}")
        if not MIN_INPUT_SIZE <= self.input_size <= MAX_INPUT_SIZE:
            raise ModelError(
                f"input_size must be {MIN_INPUT_SIZE} to {MAX_INPUT_SIZE} pixels (what the networks take), got "
                f"{self.input_size}"
            )
        if self.tile_px is not None and self.tile_px < 1:
            raise ModelError(f"tile_px must be positive, got {self.tile_px}")
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise ModelError(f"scale must be a positive number, got {self.scale}")
        mean, std = default_stats(self.in_chans)
        object.__setattr__(self, "mean", tuple(float(v) for v in (self.mean or mean)))
        object.__setattr__(self, "std", tuple(float(v) for v in (self.std or std)))
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            raise ModelError(
                f"mean and std need {self.in_chans} value(s) each, got {list(self.mean)}, {list(self.std)}"
            )
        if any(not (math.isfinite(s) and STD_RANGE[0] <= s <= STD_RANGE[1]) for s in self.std):
            raise ModelError(
                f"std values must be {STD_RANGE[0]} to {STD_RANGE[1]} (of pixel values scaled to 0-1; ImageNet's are "
                f"about 0.22), got {list(self.std)}"
            )
        if any(not (math.isfinite(m) and 0.0 <= m <= 1.0) for m in self.mean):
            raise ModelError(f"mean values must be 0 to 1 (of pixel values scaled to 0-1), got {list(self.mean)}")
        if self.resize != RESIZE_RULE:
            raise ModelError(f"unknown resize rule {self.resize!r}; this version implements {RESIZE_RULE!r}")

    def fit(self, tile: Pixels) -> Pixels:
        """One tile's pixels (RGB or gray ``uint8``) -> ``uint8`` (input_size, input_size, in_chans) (`fit_tile`)."""
        return fit_tile(tile, self.input_size, self.in_chans)

    def tensor(self, images: Pixels, device: torch.device | str = "cpu") -> torch.Tensor:
        """A batch of fitted tiles -> the normalised ``float32`` (B, C, S, S) the network takes (`normalise`)."""
        return normalise(images, self.mean, self.std, device)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (tuples as lists)."""
        out = asdict(self)
        out["mean"], out["std"] = list(self.mean), list(self.std)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Preprocess:
        """The inverse of `to_json`; raises `ModelError` on unknown or missing fields and bad values."""
        known = {"input_size", "in_chans", "tile_px", "scale", "grayscale", "mean", "std", "resize"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelError(f"unknown preprocessing field(s) {unknown}")
        if "input_size" not in data:
            raise ModelError("preprocessing lacks input_size")
        try:
            return cls(
                input_size=int(data["input_size"]),
                in_chans=int(data.get("in_chans", 3)),
                tile_px=None if data.get("tile_px") is None else int(data["tile_px"]),
                scale=None if data.get("scale") is None else float(data["scale"]),
                grayscale=bool(data.get("grayscale", False)),
                mean=tuple(float(v) for v in data.get("mean", ())),
                std=tuple(float(v) for v in data.get("std", ())),
                resize=str(data.get("resize", RESIZE_RULE)),
            )
        except (TypeError, ValueError) as exc:
            raise ModelError(f"preprocessing holds a value of the wrong type ({exc})") from None
