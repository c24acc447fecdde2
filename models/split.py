"""The head/base split of FedSAF (paper 001, Sec. 3.1, Eq. 1; Table 1).

A model is an ordered list of *layer units*, its parameter-bearing blocks from input to output. For torchvision's
MobileNetV3-Small these are ``features.0 ... features.12``, ``classifier.0`` and ``classifier.3`` (15 units, as
in the paper's Table 1). ``nhead`` counts units from the output end: the last ``nhead`` units are the
personalised head eta_i that stays on the hospital, the rest is the shared base rho_i.

Which containers are opened up into their children is set per architecture (``_EXPAND``); a unit owns every
``state_dict`` entry under its prefix, BatchNorm buffers included, so the units partition the ``state_dict``.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from models.errors import ModelError

Unit = tuple[str, list[str]]

# Containers whose children become units; "" is the model itself. Everything else with parameters is one unit.
_EXPAND: dict[str, frozenset[str]] = {
    "MobileNetV3": frozenset({"", "features", "classifier"}),  # features.0..12, classifier.0, classifier.3
    "ResNet": frozenset({"", "layer1", "layer2", "layer3", "layer4"}),  # conv1, bn1, 8 BasicBlocks, fc
    "EfficientNet": frozenset({"", "features", "classifier"}),  # features.0..8 (stem, 7 stages, head conv), fc
    "AlexNet": frozenset({"", "features", "classifier"}),  # 5 convolutions, 3 linear layers
}


def split_units(model: nn.Module) -> list[Unit]:
    """Ordered ``(unit_name, [state_dict keys])`` of the model's layer units, input to output."""
    expand = _EXPAND.get(type(model).__name__)
    if expand is None:
        raise ModelError(f"no layer units defined for {type(model).__name__}: add it to models.split._EXPAND")
    names: list[str] = []

    def walk(prefix: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            path = f"{prefix}.{child_name}" if prefix else child_name
            if path in expand:
                walk(path, child)
            elif any(True for _ in child.parameters()):
                names.append(path)

    walk("", model)
    keys = list(model.state_dict().keys())
    units: list[Unit] = [(name, [k for k in keys if k.startswith(name + ".")]) for name in names]
    covered = sum(len(unit_keys) for _, unit_keys in units)
    if covered != len(keys):
        raise ModelError(f"layer units of {type(model).__name__} do not cover its state_dict ({covered}/{len(keys)})")
    return units


def check_nhead(nhead: int, units: Sequence[Unit]) -> None:
    """Raise ``ModelError`` unless ``0 <= nhead <= len(units)``."""
    if not 0 <= nhead <= len(units):
        raise ModelError(
            f"nhead={nhead} is out of range: this model has {len(units)} layer units, so use 0..{len(units)}"
        )


def head_keys(units: Sequence[Unit], nhead: int) -> list[str]:
    """``state_dict`` keys of the last ``nhead`` units: the personalised head that never leaves the client."""
    check_nhead(nhead, units)
    keep = units[len(units) - nhead :]
    return [k for _, unit_keys in keep for k in unit_keys]


def base_keys(units: Sequence[Unit], nhead: int) -> list[str]:
    """``state_dict`` keys of every unit but the last ``nhead``: the shared base rho_i."""
    check_nhead(nhead, units)
    share = units[: len(units) - nhead]
    return [k for _, unit_keys in share for k in unit_keys]


def batchnorm_keys(model: nn.Module, *, affine: bool) -> list[str]:
    """``state_dict`` keys of the model's BatchNorm layers: their running statistics (``running_mean``,
    ``running_var``, ``num_batches_tracked``) and, with ``affine``, their ``weight`` and ``bias`` too.

    What FedBN (Li et al., 2021) keeps at each client (statistics and affine parameters), or, without ``affine``,
    what PFLlib's clients never overwrite (the running statistics).
    """
    keys: list[str] = []
    kinds = ("running_mean", "running_var", "num_batches_tracked") + (("weight", "bias") if affine else ())
    state = model.state_dict()
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            keys.extend(f"{name}.{kind}" for kind in kinds if f"{name}.{kind}" in state)
    return keys
