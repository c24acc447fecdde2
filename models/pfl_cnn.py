"""PFLlib's small CNN for MNIST-like images (``FedAvgCNN``), as a registry architecture named ``fedavg_cnn``.

PFLlib (Zhang et al., "PFLlib: A Beginner-Friendly and Comprehensive Personalized Federated Learning Library",
JMLR 2025; ``system/flcore/trainmodel/models.py``) trains Fashion-MNIST with ``FedAvgCNN(in_features=1,
num_classes=10, dim=1024)``, the CNN of McMahan et al.'s FedAvg paper (AISTATS 2017, "CNN" for MNIST): two 5x5
convolutions without padding (32 and 64 channels), each followed by ReLU and 2x2 max-pooling, a 512-unit
fully-connected layer with ReLU and the output layer. The same four parameter-bearing blocks and ``state_dict``
keys here (``conv1.0``, ``conv2.0``, ``fc1.0``, ``fc``), so the model's layer units are ``conv1``, ``conv2``,
``fc1`` and ``fc`` (`models.split`), and PFLlib's FedRep/FedAvg head (``fc``) is ``nhead = 1``.

One addition: an adaptive average pooling to 4 x 4 before flattening. At PFLlib's 28 x 28 input the map is
already 4 x 4 (28 -> 24 -> 12 -> 8 -> 4), so the pooling is the identity and the network computes exactly
PFLlib's; at another input size it keeps the 1,024 inputs of ``fc1`` instead of failing. ``in_chans`` 1 (PFLlib's
grey input) or 3 (the project's tiles, grey stored as three equal channels) is the first convolution's width.
"""

from __future__ import annotations

import torch
from torch import nn

POOLED = 4  # the 4 x 4 map of a 28 px input after two (conv 5x5, pool 2) stages
WIDTH = 64 * POOLED * POOLED  # PFLlib's dim=1024 for MNIST-like input


class FedAvgCNN(nn.Module):
    """PFLlib's ``FedAvgCNN`` (module docstring) with ``in_chans`` input channels and ``num_classes`` outputs."""

    def __init__(self, in_chans: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_chans, 32, kernel_size=5, padding=0, stride=1, bias=True),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=(2, 2)),
        )
        self.conv2 = nn.Sequential(
            nn.Conv2d(32, 64, kernel_size=5, padding=0, stride=1, bias=True),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=(2, 2)),
        )
        self.pool = nn.AdaptiveAvgPool2d((POOLED, POOLED))
        self.fc1 = nn.Sequential(nn.Linear(WIDTH, 512), nn.ReLU(inplace=True))
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.conv2(self.conv1(x)))
        return self.fc(self.fc1(torch.flatten(out, 1)))


def fedavg_cnn(weights: None = None, num_classes: int = 10) -> nn.Module:
    """The registry's builder (torchvision's signature: ``weights`` must be ``None``, random initialisation)."""
    return FedAvgCNN(in_chans=3, num_classes=num_classes)
