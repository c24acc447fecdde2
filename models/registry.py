"""Architecture registry: the four networks of the FedSAF paper's Table 3 (paper 001, Sec. 4.3.1), PFLlib's small
CNN for 28 px images (``fedavg_cnn``, `models.pfl_cnn`, for the paper's Table 7 on Fashion-MNIST), and timm's.

MobileNetV3-Small (the paper's choice and our default), ResNet-18, EfficientNet-B0 and AlexNet come from
torchvision, always built with random weights (nothing is downloaded); a local safetensors file may replace
them. Grayscale hospitals are handled in the data loader by replicating the gray channel three times, so every
hospital runs the *same* 3-channel architecture and every layer can be shared; ``in_chans=1`` is offered for a
federation where every tile is converted to gray (the first convolution is then rebuilt for one channel).

Any architecture of timm is built as ``timm/<timm model name>`` (e.g. ``timm/resnet10t``) with
``timm.create_model(name, pretrained=False, num_classes=..., in_chans=...)``, timm's documented factory
(https://huggingface.co/docs/timm/reference/models#timm.create_model): random weights, nothing fetched, the input
channels set by timm itself. Its layer units are timm's own grouping of its blocks (`models.split`). A local
weights file goes through `load_weights` as for the four: timm's ``pretrained=True`` with
``pretrained_cfg_overlay=dict(file=...)`` reads a local file without the network too (``_resolve_pretrained_source``
in ``timm/models/_builder.py`` picks ``load_from='file'`` before any URL or hub), but it drops the classifier
whenever ``num_classes`` differs from the pretrained config's (1000), so it would discard the head of a 2-class
checkpoint, and it loads before a GroupNorm swap.

The architectures' names, smallest inputs and layer-unit counts are in `models.names`, which needs no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torchvision import models as tvm

from models.errors import ModelError
from models.names import (
    DEFAULT_MODEL,
    LAYER_UNITS,
    MODEL_NAMES,
    check_input_size,
    check_model_name,
    is_timm_name,
    min_input_size,
    timm_model_name,
)
from models.pfl_cnn import fedavg_cnn

_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "mobilenet_v3_small": tvm.mobilenet_v3_small,
    "resnet18": tvm.resnet18,
    "efficientnet_b0": tvm.efficientnet_b0,
    "alexnet": tvm.alexnet,
    "fedavg_cnn": fedavg_cnn,  # PFLlib's small CNN for 28 px images (models.pfl_cnn), not torchvision's
}
BATCHNORM_MOMENTUM = 0.1
GROUPNORM_GROUPS = 8


def group_norm_groups(channels: int) -> int:
    """GroupNorm's group count for a layer of ``channels``: ``gcd(channels, GROUPNORM_GROUPS)``.

    Opacus's ``ModuleValidator.fix`` swaps BatchNorm for ``GroupNorm(min(32, C), C)``, which MobileNetV3-Small's
    widths of 40, 72, 88 and 120 channels do not divide; every width of the registry's models is a multiple of 8,
    so each layer gets 8 groups (Wu & He, "Group Normalization", 2018, find 8-32 groups equally good)."""
    return math.gcd(int(channels), GROUPNORM_GROUPS)


def to_group_norm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm of ``model`` by a GroupNorm over the same channels (`group_norm_groups`), in place;
    a GroupNorm normalises each sample on its own and keeps no running statistics, so no batch mixes two slides
    and no statistic of private data is stored (what differential privacy needs, docs/privacy.md)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            channels = int(module.num_features)
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            new: nn.Module
            act = getattr(module, "act", None)
            if isinstance(act, nn.Module):
                from timm.layers import GroupNormAct  # only a timm model has these layers

                # timm's norm + activation layers (timm.layers.BatchNormAct2d) carry the drop and activation that
                # follow the norm; their GroupNorm twin (timm.layers.GroupNormAct) takes both over unchanged.
                new = GroupNormAct(channels, group_norm_groups(channels), eps=module.eps)
                new.drop = getattr(module, "drop", nn.Identity())
                new.act = act
            else:
                new = nn.GroupNorm(group_norm_groups(channels), channels, eps=module.eps)
            setattr(parent, child, new)
    return model


def create_model(
    name: str = DEFAULT_MODEL,
    num_classes: int = 2,
    in_chans: int = 3,
    weights: str | Path | None = None,
    norm: str | None = None,
) -> nn.Module:
    """Build ``name`` with random weights for ``num_classes`` outputs and ``in_chans`` input channels.

    ``norm``: ``"batch"`` (``None``, the architecture's own BatchNorm) or ``"group"`` (`to_group_norm`).

    ``weights``: an optional local ``.safetensors`` file holding a ``state_dict`` for the same architecture.
    Every key must match; only the output layer may differ in shape (e.g. a 1000-class file used for 2
    classes), in which case that layer keeps its random initialisation.
    """
    check_model_name(name)
    if num_classes < 2:
        raise ModelError(f"num_classes must be at least 2, got {num_classes}")
    if in_chans not in (1, 3):
        raise ModelError(f"in_chans must be 1 or 3, got {in_chans}")
    model = _create_timm(name, num_classes, in_chans) if is_timm_name(name) else _build_torchvision(name, num_classes)
    # torchvision gives MobileNetV3/EfficientNet a BatchNorm momentum of 0.01, tuned for ImageNet's ~10^4 steps
    # per epoch. A hospital takes a few dozen steps per round, so running statistics would stay near their
    # initial values and evaluation (which uses them) would see un-normalised activations; 0.1, PyTorch's
    # default, lets them settle within a round.
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.momentum = BATCHNORM_MOMENTUM
    if in_chans != 3 and not is_timm_name(name):
        _replace_first_conv(model, in_chans)
    if norm == "group":
        to_group_norm(model)
    elif norm not in (None, "batch"):
        raise ModelError(f"unknown normalisation {norm!r}: use batch or group")
    if weights:
        load_weights(model, name, Path(weights))
    return model


def _build_torchvision(name: str, num_classes: int) -> nn.Module:
    """One of the four torchvision networks with random weights (``weights=None``: nothing is downloaded)."""
    return _BUILDERS[name](weights=None, num_classes=num_classes)


def _create_timm(name: str, num_classes: int, in_chans: int) -> nn.Module:
    """``timm/<arch>`` built by ``timm.create_model(arch, pretrained=False, ...)``, with a one-line ``ModelError``
    for a name the installed timm does not know (``timm.is_model``) or a model without layer units."""
    import timm

    from models.split import split_units

    arch = timm_model_name(name)
    if not timm.is_model(arch):
        raise ModelError(
            f"model {name!r}: timm {timm.__version__} has no model {arch!r}; "
            "choose a name from timm.list_models() (e.g. timm/resnet18)"
        )
    try:
        model: nn.Module = timm.create_model(arch, pretrained=False, num_classes=num_classes, in_chans=in_chans)
    except (TypeError, ValueError, RuntimeError, AssertionError) as exc:
        detail = " ".join(str(exc).split())
        raise ModelError(f"model {name!r}: timm could not build {arch!r} ({detail})") from exc
    split_units(model)  # a model without timm's block grouping is refused here, not in the first round
    return model


def layer_unit_count(name: str) -> int:
    """How many layer units ``name`` has: `models.names.LAYER_UNITS` for the four torchvision names; a timm model is
    built on PyTorch's ``meta`` device (shapes, no memory, no initialisation cost) and its units counted."""
    from models.split import split_units

    check_model_name(name)
    if not is_timm_name(name):
        return LAYER_UNITS[name]
    with torch.device("meta"):
        model = _create_timm(name, 2, 3)
    return len(split_units(model))


def _replace_first_conv(model: nn.Module, in_chans: int) -> None:
    """Swap the stem convolution for one taking ``in_chans`` channels (same geometry, fresh init)."""
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            new = nn.Conv2d(
                in_chans,
                module.out_channels,
                kernel_size=module.kernel_size,  # type: ignore[arg-type]
                stride=module.stride,  # type: ignore[arg-type]
                padding=module.padding,  # type: ignore[arg-type]
                dilation=module.dilation,  # type: ignore[arg-type]
                groups=1,
                bias=module.bias is not None,
            )
            parent_name, _, child = module_name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, new)
            return
    raise ModelError("model has no convolution to adapt to the requested input channels")


def _timm_cfg_modules(model: nn.Module, field: str) -> list[str]:
    """The module names a timm model's ``pretrained_cfg`` gives under ``field`` (``first_conv``, ``classifier``:
    fields of timm's ``PretrainedCfg``, ``timm/models/_pretrained.py``), present in ``model``; empty for a
    torchvision model."""
    cfg = getattr(model, "pretrained_cfg", None)
    value = cfg.get(field) if isinstance(cfg, dict) else None
    names = [value] if isinstance(value, str) else list(value or ())
    present = {n for n, _ in model.named_modules()}
    return [n for n in names if isinstance(n, str) and n in present]


def _output_keys(model: nn.Module) -> set[str]:
    """``state_dict`` keys of the output layer, which may differ in shape in a weights file made for other classes:
    a timm model's classifier (its ``pretrained_cfg["classifier"]``), else the last layer unit."""
    from models.split import split_units

    classifiers = _timm_cfg_modules(model, "classifier")
    if classifiers:
        return {k for k in model.state_dict() if any(k.startswith(c + ".") for c in classifiers)}
    return set(split_units(model)[-1][1])


def _stem_key(model: nn.Module) -> str:
    """The ``state_dict`` key of the first convolution's weight (the one ``in_chans`` changes): a timm model's
    ``pretrained_cfg["first_conv"]``, else the first ``Conv2d``."""
    for first in _timm_cfg_modules(model, "first_conv"):
        if isinstance(model.get_submodule(first), nn.Conv2d):
            return f"{first}.weight"
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            return f"{module_name}.weight"
    raise ModelError("model has no convolution")


def load_weights(model: nn.Module, name: str, path: Path) -> None:
    """Load a local safetensors ``state_dict`` into ``model`` with a clear error on any mismatch.

    A file made for another number of input channels (an RGB ImageNet file for a one-channel model, or the other way
    round) still loads: its stem convolution is adapted with timm's ``adapt_input_conv`` (one channel: the sum of the
    RGB filters, so a gray tile equal in every channel gives the same response; three from one: the filter repeated
    and scaled by 1/3), as ``timm.create_model(..., pretrained=True, in_chans=1)`` does for timm's own weights.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from timm.models import adapt_input_conv

    if not path.is_file():
        raise ModelError(f"weights file {path} does not exist: give a local .safetensors file or leave weights empty")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelError(f"weights file {path} is not a readable safetensors file ({exc})") from exc
    own = model.state_dict()
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing or unexpected:
        detail = f"{len(missing)} missing (e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]})"
        raise ModelError(f"weights file {path} does not fit {name}: {detail}; export the state_dict of {name}")
    output_keys = _output_keys(model)
    stem = _stem_key(model)
    loadable: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if value.shape == own[key].shape:
            loadable[key] = value
        elif (
            key == stem
            and value.ndim == 4
            and value.shape[0] == own[key].shape[0]
            and value.shape[2:] == own[key].shape[2:]
        ):
            loadable[key] = adapt_input_conv(own[key].shape[1], value, base_chans=value.shape[1]).to(own[key].dtype)
        elif key not in output_keys:
            raise ModelError(
                f"weights file {path} does not fit {name}: {key} has shape {tuple(value.shape)}, "
                f"the model needs {tuple(own[key].shape)}"
            )
    model.load_state_dict(loadable, strict=False)


__all__ = [
    "BATCHNORM_MOMENTUM",
    "DEFAULT_MODEL",
    "MODEL_NAMES",
    "check_input_size",
    "check_model_name",
    "create_model",
    "layer_unit_count",
    "load_weights",
    "min_input_size",
]
