"""What the server and the hospitals both derive from a run's configuration: seeds, device, initial weights.

Determinism (FedSAF paper 001, Algorithm 1 run as a reproducible experiment): each hospital's round draws every
random number (shuffling, augmentation, dropout, the Fisher mini-batch) from a seed derived from (run seed, round,
client); the initial weights come from (run seed, "init"). Server and hospitals compute the same initial model
on their own, so nothing but the shared part ever has to travel, and a run resumed from its last checkpoint ends
with the same numbers as one that never stopped, without saving any RNG state.
"""

from __future__ import annotations

import tomllib

import numpy as np
import torch

from federation.config import ModelSection, RunConfig, config_from_dict
from federation.errors import FederationError
from federation.wire.contract import LABELS, TensorDict
from models import Unit, create_model, split_units

NUM_CLASSES = len(LABELS)  # the binary task's; a run's own count comes from its dataset (``HelloReply.classes``)


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed from (run seed, round, client, ...): independent streams, reproducible anywhere."""
    words = [p if isinstance(p, int) else int.from_bytes(p.encode(), "little") % (2**32) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1)[0]) & 0x7FFFFFFF


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FederationError("run.device = cuda but no CUDA GPU is visible: use run.device = cpu or auto")
    return torch.device(name)


def config_from_text(text: str, source: str = "run configuration") -> RunConfig:
    """A ``RunConfig`` from the TOML text ``config_to_toml`` wrote (what the server sends in ``Hello``)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FederationError(f"{source} is not valid TOML: {exc}") from exc
    return config_from_dict(raw, source)


def initial_state(config: RunConfig, num_classes: int = NUM_CLASSES) -> tuple[TensorDict, list[Unit]]:
    """The common initial weights (from ``model.weights`` or seeded random init) of a model with ``num_classes``
    outputs (the dataset's classes), and the model's layer units."""
    return initial_weights(config.model, config.run.seed, num_classes)


def initial_weights(model: ModelSection, seed: int, num_classes: int = NUM_CLASSES) -> tuple[TensorDict, list[Unit]]:
    """``initial_state`` from the two parts of the configuration it reads: the ``[model]`` section and
    ``run.seed``."""
    torch.manual_seed(derive_seed(seed, "init"))
    net = create_model(model.name, num_classes, model.in_chans, model.weights or None, norm=model.norm)
    return {k: v.detach().clone() for k, v in net.state_dict().items()}, split_units(net)
