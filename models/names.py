"""What the registry's architectures are called and what they accept, without importing torch.

The four networks of the FedSAF paper's Table 3 (paper 001, Sec. 4.3.1), their smallest input side, and how many
layer units each has (`models.split.split_units`, paper 001 Eq. 1: ``nhead`` counts units from the output end,
so it ranges over ``0 .. units``). The run configuration (`federation.config`) and the dashboard's form check
settings with these before anything builds a model; `models.registry` builds the networks with torch.
"""

from __future__ import annotations

from models.errors import ModelError

DEFAULT_MODEL = "mobilenet_v3_small"
MODEL_NAMES: tuple[str, ...] = ("mobilenet_v3_small", "resnet18", "efficientnet_b0", "alexnet")

# AlexNet's stride-4 stem and three 3x3/2 max-pools need a 63-pixel input to leave a 1x1 map before its
# adaptive pooling; the others downsample 32x, so 32 pixels leave one spatial position.
_MIN_INPUT: dict[str, int] = {"mobilenet_v3_small": 32, "resnet18": 32, "efficientnet_b0": 32, "alexnet": 63}

# Parameter-bearing top-level blocks, input to output (``len(split_units(create_model(name)))``; tests/models
# build each model and count them): MobileNetV3-Small features.0-12 + classifier.0 + classifier.3 (DESIGN.md),
# ResNet-18 conv1, bn1, layer1-4 (two blocks each) and fc, EfficientNet-B0 features.0-8 and classifier.1,
# AlexNet's five convolutions and three linear layers.
LAYER_UNITS: dict[str, int] = {"mobilenet_v3_small": 15, "resnet18": 11, "efficientnet_b0": 10, "alexnet": 8}


def check_model_name(name: str) -> None:
    """Raise ``ModelError`` unless ``name`` is a registered architecture."""
    if name not in MODEL_NAMES:
        raise ModelError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}")


def min_input_size(name: str) -> int:
    """Smallest square input side (pixels) the architecture accepts."""
    check_model_name(name)
    return _MIN_INPUT[name]


def check_input_size(name: str, input_size: int) -> None:
    """Raise ``ModelError`` if tiles of side ``input_size`` are too small for ``name``."""
    smallest = min_input_size(name)
    if input_size < smallest:
        raise ModelError(
            f"input_size {input_size} is too small for {name}: it needs at least {smallest} pixels "
            f"(set data.input_size >= {smallest})"
        )


def layer_units(name: str) -> int:
    """How many layer units ``name`` has: the largest ``nhead`` it allows."""
    check_model_name(name)
    return LAYER_UNITS[name]
