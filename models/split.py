"""The head/base split of FedSAF (paper 001, Sec. 3.1, Eq. 1; Table 1).

A model is an ordered list of *layer units*, its parameter-bearing blocks from input to output. For torchvision's
MobileNetV3-Small these are ``features.0 ... features.12``, ``classifier.0`` and ``classifier.3`` (15 units, as
in the paper's Table 1). ``nhead`` counts units from the output end: the last ``nhead`` units are the
personalised head eta_i that stays on the hospital, the rest is the shared base rho_i.

Which containers are opened up into their children is set per architecture (``_EXPAND``); a unit owns every
``state_dict`` entry under its prefix, BatchNorm buffers included, so the units partition the ``state_dict``.

A timm model (``timm/<name>``, `models.names`) is split by timm's own ordered grouping of its blocks: the model's
``group_matcher(coarse=False)``, the grouping timm's layer-wise learning-rate decay uses
(``param_groups_layer_decay`` in timm's ``timm/optim/_param_groups.py``, which hands it to
``timm.models.group_parameters``). Each group is one unit: the stem, then every block
(``blocks.i.j`` of an EfficientNet or MobileNetV3, ``layerI.J`` of a ResNet, ``stages.i.blocks.j`` of a ConvNeXt,
``blocks.i`` of a ViT), where timm folds a final convolution or norm into the last block, and last whatever the
matcher leaves unmatched, which timm groups after every block: the classifier (with a MobileNetV3's
``conv_head``), so ``nhead=1`` keeps exactly timm's head. A unit's keys are in ``state_dict`` order and its name
joins the shortest module paths that hold its keys only (``blocks.1.0``, ``conv_stem+bn1``).
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
    "FedAvgCNN": frozenset({""}),  # PFLlib's CNN (models.pfl_cnn): conv1, conv2, fc1, fc
}


def split_units(model: nn.Module) -> list[Unit]:
    """Ordered ``(unit_name, [state_dict keys])`` of the model's layer units, input to output."""
    if is_timm_model(model):
        return _timm_units(model)
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


def is_timm_model(model: nn.Module) -> bool:
    """Whether ``model`` is one of timm's architectures (timm's ``ResNet`` or ``EfficientNet`` share their class
    names with torchvision's, so the defining module tells them apart)."""
    return type(model).__module__.startswith("timm.")


def _timm_units(model: nn.Module) -> list[Unit]:
    """Units of a timm model: its ``group_matcher(coarse=False)`` groups in timm's order (module docstring)."""
    # timm's public group_parameters / group_modules apply this function to named parameters / modules; applied to
    # the state_dict's keys it also places each BatchNorm buffer with its layer.
    from timm.models._manipulate import group_with_matcher

    matcher = getattr(model, "group_matcher", None)
    try:
        spec = matcher(coarse=False) if callable(matcher) else None
    except NotImplementedError:
        spec = None
    if not spec:
        raise ModelError(
            f"timm's {type(model).__name__} defines no group_matcher(), so it has no layer units; choose another model"
        )
    keys = list(model.state_dict().keys())
    groups: dict[int, list[str]] = group_with_matcher(((k, None) for k in keys), spec)
    unit_of = {k: gid for gid, unit_keys in groups.items() for k in unit_keys}
    # every module path (and key) -> the units holding a key under it
    owners: dict[str, set[int]] = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            owners.setdefault(".".join(parts[:n]), set()).add(unit_of[key])
    units: list[Unit] = []
    for gid in sorted(groups):
        unit_keys = [k for k in keys if unit_of[k] == gid]
        units.append((_unit_name(unit_keys, owners, gid), unit_keys))
    return units


def _unit_name(keys: Sequence[str], owners: dict[str, set[int]], gid: int) -> str:
    """The shortest module paths holding only this unit's keys, joined by ``+``: ``blocks.1.0``, ``conv_stem+bn1``,
    ``stages.1.downsample+stages.1.blocks.0``. Distinct units get distinct names, since no path is in two."""
    paths: dict[str, None] = {}
    for key in keys:
        parts = key.split(".")
        for n in range(1, len(parts) + 1):
            path = ".".join(parts[:n])
            if owners[path] == {gid}:
                paths[path] = None
                break
    return "+".join(paths)


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
