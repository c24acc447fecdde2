"""Model registry (paper 001, Table 3) and the head/base split by ``nhead`` (paper 001, Eq. 1)."""

from models.errors import ModelError
from models.registry import (
    DEFAULT_MODEL,
    MODEL_NAMES,
    check_input_size,
    check_model_name,
    create_model,
    load_weights,
    min_input_size,
)
from models.split import Unit, base_keys, batchnorm_keys, check_nhead, head_keys, split_units

__all__ = [
    "DEFAULT_MODEL",
    "MODEL_NAMES",
    "ModelError",
    "Unit",
    "base_keys",
    "batchnorm_keys",
    "check_input_size",
    "check_model_name",
    "check_nhead",
    "create_model",
    "head_keys",
    "load_weights",
    "min_input_size",
    "split_units",
]
