"""The Fisher trace (FedSAF paper Eq. 12-15) against a naive per-sample loop of backward passes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.checks import every
from torch import nn

from federation.errors import FederationError
from federation.hospital.fisher import fisher_trace


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 5),
        nn.Dropout(0.5),
        nn.Linear(5, 2),
    )
    # Non-trivial running statistics, so that eval-mode BatchNorm is not the identity.
    bn = model[1]
    assert isinstance(bn, nn.BatchNorm2d)
    assert bn.running_mean is not None
    assert bn.running_var is not None
    bn.running_mean.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    bn.running_var.copy_(torch.tensor([0.5, 2.0, 1.5, 1.0]))
    return model


def _naive_trace(model: nn.Module, names: list[str], inputs: torch.Tensor, targets: torch.Tensor) -> float:
    model.eval()
    params = dict(model.named_parameters())
    total = 0.0
    for x, y in zip(inputs, targets, strict=True):
        model.zero_grad()
        loss = F.nll_loss(F.log_softmax(model(x.unsqueeze(0)), dim=1), y.unsqueeze(0))
        loss.backward()
        for n in names:
            g = params[n].grad
            assert g is not None
            total += float(g.pow(2).sum())
    return total / inputs.shape[0]


def test_fisher_trace_equals_a_per_sample_loop_over_the_shared_parameters() -> None:
    model = _tiny_model()
    inputs = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([0, 1, 1, 0, 1, 1])
    shared = ["0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"]  # "7.*" is the local head
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = fisher_trace(model, shared, inputs, targets)
    # the pass leaves the model's mode and BatchNorm statistics as they were
    assert model.training
    assert every(torch.equal(before[k], v) for k, v in model.state_dict().items())
    slow = _naive_trace(model, shared, inputs, targets)
    assert slow > 0
    assert fast == pytest.approx(slow, rel=1e-5, abs=1e-7)
    # chunking the vmap gives the same number
    assert fisher_trace(model, shared, inputs, targets, chunk_size=4) == pytest.approx(slow, rel=1e-5, abs=1e-7)
    # the head's parameters are excluded: including them changes the trace
    everything = [n for n, _ in model.named_parameters()]
    full = fisher_trace(model, everything, inputs, targets)
    assert full == pytest.approx(_naive_trace(model, everything, inputs, targets), rel=1e-5, abs=1e-7)
    assert full > fast


def test_fisher_trace_rejects_unknown_parameters_and_empty_batches() -> None:
    model = _tiny_model()
    with pytest.raises(FederationError, match="no parameters named"):
        fisher_trace(model, ["classifier.weight"], torch.zeros(2, 3, 8, 8), torch.zeros(2, dtype=torch.long))
    with pytest.raises(FederationError, match="non-empty mini-batch"):
        fisher_trace(model, ["0.weight"], torch.zeros(0, 3, 8, 8), torch.zeros(0, dtype=torch.long))
