"""Trace of the empirical Fisher information over the shared parameters (FedSAF paper 001, Eq. 12-15).

Each client reports ``tFIM_i``: the mean, over a mini-batch of its training data, of the squared norm of the
per-sample gradient of the negative log-likelihood (softmax + NLL, i.e. cross-entropy on the logits) with respect
to the *shared* parameters only. The server turns the traces into the weights ``gamma_i`` of Eq. 14
(``federation.strategies.aggregation.fisher_weights``); a straggler (an under-trained client) has a small trace and so a
small say in ``p_i`` (Eq. 20).

The per-sample gradients come from one vectorised pass: ``torch.func.vmap`` over ``torch.func.grad`` of a
``functional_call`` of the model on a single example, instead of a Python loop of backward passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from federation.errors import FederationError
from federation.hospital.data import HospitalData, to_tensor


def fisher_trace(
    model: nn.Module,
    param_names: Sequence[str],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int | None = None,
) -> float:
    """``tFIM = 1/B sum_b ||d NLL(x_b, y_b) / d theta_shared||^2`` on the mini-batch ``(inputs, targets)``.

    ``param_names`` are the names (as in ``model.named_parameters()``) of the shared parameters; the others
    (the personalised head) are held fixed and do not contribute. ``chunk_size`` bounds how many per-sample
    gradients are materialised at once (memory ~ ``chunk_size x`` the shared parameter count); ``None`` does
    the whole batch in one go.

    The model is put in eval mode for this pass and restored afterwards: in train mode BatchNorm normalises
    with the statistics of the batch, which couples the samples (a "per-sample" gradient would then depend on
    the other samples, and computing one sample at a time would normalise over a batch of one), and it would
    also update the running statistics as a side effect. Eval mode uses the running statistics, so each
    sample's loss depends only on that sample, and dropout is off, so the trace is deterministic.
    """
    if inputs.shape[0] == 0 or inputs.shape[0] != targets.shape[0]:
        raise FederationError(
            f"fisher_trace needs a non-empty mini-batch with one target per input, got {inputs.shape[0]} inputs "
            f"and {targets.shape[0]} targets"
        )
    named = dict(model.named_parameters())
    wanted = list(dict.fromkeys(param_names))
    unknown = [n for n in wanted if n not in named]
    if unknown:
        raise FederationError(f"fisher_trace: the model has no parameters named {unknown[:5]}")
    if not wanted:
        raise FederationError("fisher_trace: no shared parameters given (nothing to compute the trace over)")

    shared = {n: named[n].detach() for n in wanted}
    fixed: dict[str, torch.Tensor] = {n: p.detach() for n, p in named.items() if n not in shared}
    fixed.update({n: b.detach() for n, b in model.named_buffers()})

    def sample_loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, (params, fixed), (x.unsqueeze(0),))
        # cross_entropy = log-softmax + NLL: the paper's "NLL combined with the softmax function".
        return F.cross_entropy(logits, y.unsqueeze(0))

    was_training = model.training
    model.eval()
    try:
        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0), chunk_size=chunk_size)(
            shared, inputs, targets.long()
        )
    finally:
        model.train(was_training)
    squared = torch.zeros(inputs.shape[0], dtype=torch.float64, device=inputs.device)
    for g in per_sample.values():
        squared += g.detach().reshape(g.shape[0], -1).to(torch.float64).pow(2).sum(dim=1)
    return float(squared.mean())


def batch_gradient_trace(
    model: nn.Module, param_names: Sequence[str], batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> float:
    """FedAS's Fisher trace estimate: ``sum_b ||d mean-NLL(batch_b) / d theta_shared||^2`` over all ``batches``.

    The squared norm of each batch's *mean* gradient (not of per-sample gradients), summed over the client's
    training batches, in eval mode for the same reasons as ``fisher_trace`` (BatchNorm uses running statistics,
    dropout is off, nothing is updated). It grows with the number of batches, so a hospital with more data
    reports more information, as FedAS intends.
    """
    named = dict(model.named_parameters())
    unknown = [n for n in param_names if n not in named]
    if unknown or not param_names:
        raise FederationError(f"batch_gradient_trace: no shared parameters named {unknown[:5] or list(param_names)}")
    params = [named[n] for n in dict.fromkeys(param_names)]
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        for inputs, targets in batches:
            loss = F.cross_entropy(model(inputs), targets.long())
            grads = torch.autograd.grad(loss, params)
            total += float(sum(g.detach().to(torch.float64).pow(2).sum() for g in grads))
    finally:
        model.train(was_training)
    return total


def reported_trace(
    model: nn.Module,
    names: Sequence[str],
    data: HospitalData,
    device: torch.device,
    batch: int,
    batch_size: int,
    generator: torch.Generator,
    estimator: str = "per_sample",
) -> float:
    """The Fisher trace a hospital reports after training (``metrics["fisher_trace"]``), over the shared
    parameters ``names``, on its un-augmented training tiles: `fisher_trace` on a random mini-batch of ``batch``
    tiles drawn from ``generator`` (``estimator = "per_sample"``), or `batch_gradient_trace` over one pass in
    batches of ``batch_size`` (``"full_pass"``, no draw)."""
    if not names:
        raise FederationError(f"hospital {data.hospital}: fisher_trace needs shared parameters (nhead leaves none)")
    if estimator == "full_pass":
        images, labels = data.train_x, data.train_y
        batches = (
            (
                to_tensor(images[i : i + batch_size], device),
                torch.from_numpy(labels[i : i + batch_size]).to(device),
            )
            for i in range(0, data.num_train, batch_size)
        )
        return batch_gradient_trace(model, names, batches)
    pick = torch.randperm(data.num_train, generator=generator)[: min(batch, data.num_train)]
    x = to_tensor(data.train_x[pick.numpy()], device)
    y = torch.from_numpy(data.train_y[pick.numpy()]).to(device)
    return float(fisher_trace(model, names, x, y))
