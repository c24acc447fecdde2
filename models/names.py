"""What the registry's architectures are called and what they accept, without importing torch.

The four networks of the FedSAF paper's Table 3 (paper 001, Sec. 4.3.1) and PFLlib's small CNN (``fedavg_cnn``,
`models.pfl_cnn`), their smallest input side, and how many
layer units each has (`models.split.split_units`, paper 001 Eq. 1: ``nhead`` counts units from the output end,
so it ranges over ``0 .. units``). The run configuration (`federation.config`) and the dashboard's form check
settings with these before anything builds a model; `models.registry` builds the networks with torch.

Any other architecture of timm (https://huggingface.co/docs/timm) is named ``timm/<timm model name>``, e.g.
``timm/resnet10t`` or ``timm/mobilenetv3_small_050``. The prefix holds a ``/``, which none of the four names has,
so the two kinds cannot clash. Only the form is checked here (`check_model_name`): lower-case letters, digits and
underscores after the prefix, as every name of ``timm.list_models()`` is written, and no ``.<tag>``, which in timm
picks a set of pretrained weights (weights come only from a local file here, never from a hub). Whether the
installed timm has the model is checked when `models.registry.create_model` builds it; how many layer units it
has is known once built (`models.registry.layer_unit_count`), so `layer_units` and ``LAYER_UNITS`` cover the four
torchvision names only.

A model bundle's two files are named here too (`CARD_FILE`, `WEIGHTS_FILE`; `models.bundle` writes them), so that
torch-free readers of a run's hospital folders (`federation.runfiles`) name them without importing torch.
"""

from __future__ import annotations

import re

from models.errors import ModelError

CARD_FILE = "model.json"  # a model bundle's card (models.bundle)
WEIGHTS_FILE = "model.safetensors"  # and its weights
TISSUE_FILE = "tissue.safetensors"  # and its hospital's description of its own tissue (models.shift; never sent)
DEFAULT_MODEL = "mobilenet_v3_small"
MODEL_NAMES: tuple[str, ...] = ("mobilenet_v3_small", "resnet18", "efficientnet_b0", "alexnet", "fedavg_cnn")
TIMM_PREFIX = "timm/"
_TIMM_NAME = re.compile(r"[a-z0-9_]+")

# AlexNet's stride-4 stem and three 3x3/2 max-pools need a 63-pixel input to leave a 1x1 map before its
# adaptive pooling; the others downsample 32x, so 32 pixels leave one spatial position.
# PFLlib's FedAvgCNN (models.pfl_cnn) is built for 28 x 28 images (MNIST, Fashion-MNIST).
_MIN_INPUT: dict[str, int] = {
    "mobilenet_v3_small": 32,
    "resnet18": 32,
    "efficientnet_b0": 32,
    "alexnet": 63,
    "fedavg_cnn": 28,
}
# A timm network's smallest input is not known without building it. 32 pixels is the common total stride of
# timm's convolutional networks (``feature_info[-1]["reduction"]``); a vision transformer built for a fixed
# ``img_size`` refuses any other side when it runs, with timm's own message.
TIMM_MIN_INPUT = 32

# Parameter-bearing top-level blocks, input to output (``len(split_units(create_model(name)))``; tests/models
# build each model and count them): MobileNetV3-Small features.0-12 + classifier.0 + classifier.3 (docs/design.md),
# ResNet-18 conv1, bn1, layer1-4 (two blocks each) and fc, EfficientNet-B0 features.0-8 and classifier.1,
# AlexNet's five convolutions and three linear layers, PFLlib's FedAvgCNN conv1, conv2, fc1 and fc.
LAYER_UNITS: dict[str, int] = {
    "mobilenet_v3_small": 15,
    "resnet18": 11,
    "efficientnet_b0": 10,
    "alexnet": 8,
    "fedavg_cnn": 4,
}


def is_timm_name(name: str) -> bool:
    """Whether ``name`` asks for a timm architecture (``timm/<timm model name>``); its form is not checked."""
    return name.startswith(TIMM_PREFIX)


def timm_model_name(name: str) -> str:
    """The timm model name inside ``timm/<timm model name>`` (``ModelError`` for a name of another form)."""
    check_model_name(name)
    if not is_timm_name(name):
        raise ModelError(f"model {name!r} is not a timm model: a timm model is named {TIMM_PREFIX}<timm model name>")
    return name[len(TIMM_PREFIX) :]


def check_model_name(name: str) -> None:
    """Raise ``ModelError`` unless ``name`` is one of the four registered architectures or a well-formed
    ``timm/<timm model name>`` (the model's existence in timm is checked when it is built)."""
    if is_timm_name(name):
        arch = name[len(TIMM_PREFIX) :]
        if "." in arch:
            raise ModelError(
                f"model {name!r}: leave out the pretrained tag after '.' ({TIMM_PREFIX}{arch.split('.')[0]}); "
                "weights come only from a local file (model.weights)"
            )
        if not _TIMM_NAME.fullmatch(arch):
            raise ModelError(
                f"model {name!r} is not a timm model name: write {TIMM_PREFIX} then a name of timm.list_models() "
                f"(lower-case letters, digits, underscores), e.g. {TIMM_PREFIX}resnet18"
            )
        return
    if name not in MODEL_NAMES:
        raise ModelError(
            f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)} or {TIMM_PREFIX}<timm model name>"
        )


def min_input_size(name: str) -> int:
    """Smallest square input side (pixels) the architecture accepts (`TIMM_MIN_INPUT` for a timm model)."""
    check_model_name(name)
    if is_timm_name(name):
        return TIMM_MIN_INPUT
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
    """How many layer units ``name`` has: the largest ``nhead`` it allows (one of the four torchvision names;
    a timm model's count needs the model built: `models.registry.layer_unit_count`)."""
    check_model_name(name)
    if is_timm_name(name):
        raise ModelError(
            f"model {name!r}: a timm model's layer units are counted once it is built; "
            "use models.registry.layer_unit_count"
        )
    return LAYER_UNITS[name]
