"""Model registry (paper 001, Table 3) and the head/base split by ``nhead`` (paper 001, Eq. 1).

The four torchvision networks of the paper's Table 3 are named ``mobilenet_v3_small``, ``resnet18``,
``efficientnet_b0`` and ``alexnet``; any timm architecture is named ``timm/<timm model name>`` (e.g.
``timm/resnet10t``), built by ``timm.create_model(..., pretrained=False)`` and split into layer units by timm's
own block grouping, ``group_matcher(coarse=False)`` (`models.names`, `models.registry`, `models.split`).

The names and limits (`models.names`) are imported at once; what builds or splits a network (`models.registry`,
`models.split`) is imported on first use, so that ``import models.names`` (the run configuration's and the
dashboard's checks) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from models.errors import ModelError
from models.names import (
    DEFAULT_MODEL,
    LAYER_UNITS,
    MODEL_NAMES,
    TIMM_PREFIX,
    check_input_size,
    check_model_name,
    is_timm_name,
    layer_units,
    min_input_size,
)

if TYPE_CHECKING:
    from models.registry import create_model, layer_unit_count, load_weights
    from models.split import Unit, base_keys, batchnorm_keys, check_nhead, head_keys, split_units

# name -> the module that defines it (imports torch)
_LAZY: dict[str, str] = {
    "create_model": "models.registry",
    "layer_unit_count": "models.registry",
    "load_weights": "models.registry",
    "Unit": "models.split",
    "base_keys": "models.split",
    "batchnorm_keys": "models.split",
    "check_nhead": "models.split",
    "head_keys": "models.split",
    "split_units": "models.split",
}


def __getattr__(name: str) -> Any:
    """Import the torch-backed part of the package when one of its names is first used (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_MODEL",
    "LAYER_UNITS",
    "MODEL_NAMES",
    "TIMM_PREFIX",
    "ModelError",
    "Unit",
    "base_keys",
    "batchnorm_keys",
    "check_input_size",
    "check_model_name",
    "check_nhead",
    "create_model",
    "head_keys",
    "is_timm_name",
    "layer_unit_count",
    "layer_units",
    "load_weights",
    "min_input_size",
    "split_units",
]
