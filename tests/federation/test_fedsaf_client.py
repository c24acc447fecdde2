"""FedSAF's client side (paper 001, Eq. 24-25): the proximal pull towards p_i carries a real gradient, and the
personalised head never appears in a message.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch
from support.checks import every
from torch import nn

import federation.hospital.trainer as client_module
from federation.hospital.data import HospitalData
from federation.hospital.trainer import Trainer, proximal_term
from federation.strategies.context import StrategyContext
from federation.strategies.fedsaf import AmpSettings, AttentiveStrategy
from federation.wire.contract import Recipe, TrainInstruction

LAM, ALPHA_K = 0.3, 0.02  # lambda / alpha_K = 15


def _detached_proximal_term(
    params: Mapping[str, torch.Tensor], centre: Mapping[str, torch.Tensor], mu: float
) -> torch.Tensor:
    """The well-known broken FedAMP client: the term is built from ``.data``, so autograd never sees it."""
    flat = torch.cat([p.data.view(-1) for p in params.values()])
    target = torch.cat([c.data.view(-1) for c in centre.values()])
    return 0.5 * mu * torch.norm(flat - target, p=2) ** 2


def _grad_matches(term: torch.Tensor, params: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> bool:
    if not term.requires_grad:
        return False
    grads = torch.autograd.grad(term, list(params.values()), allow_unused=True)
    return all(g is not None and torch.allclose(g, expected[k], atol=1e-6) for g, k in zip(grads, params, strict=True))


def test_proximal_gradient_is_lambda_over_alpha_times_rho_minus_p() -> None:
    # rho = [1, -2, 0.5], p = [0.5, 0, 0.5] -> lambda/alpha_K (rho - p) = 15 * [0.5, -2, 0] = [7.5, -30, 0]
    rho = {"w": torch.tensor([1.0, -2.0, 0.5], requires_grad=True)}
    p = {"w": torch.tensor([0.5, 0.0, 0.5])}
    expected = {"w": torch.tensor([7.5, -30.0, 0.0])}
    term = proximal_term(rho, p, LAM / ALPHA_K)
    # value: 15 / 2 * (0.25 + 4 + 0) = 31.875
    assert term.item() == pytest.approx(31.875)
    assert _grad_matches(term, rho, expected)
    # The .data implementation has the same value but no gradient at all: the same check fails.
    broken = _detached_proximal_term(rho, p, LAM / ALPHA_K)
    assert broken.item() == pytest.approx(31.875)
    assert not _grad_matches(broken, rho, expected)


def _tiny_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    )


UNITS = (
    ("0", ["0.weight", "0.bias"]),
    ("1", ["1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"]),
    ("5", ["5.weight", "5.bias"]),
)
HEAD = {"5.weight", "5.bias"}


def _data(c: int, n: int = 8) -> HospitalData:
    rng = np.random.default_rng(c)
    return HospitalData(
        hospital=c,
        train_x=rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8),
        train_y=np.array([0, 1] * (n // 2), dtype=np.int64),
        test_x=rng.integers(0, 256, size=(4, 8, 8, 3), dtype=np.uint8),
        test_y=np.array([0, 1, 0, 1], dtype=np.int64),
        test_paths=[f"t{i}.png" for i in range(4)],
        grayscale=False,
    )


def _client(c: int, shared_keys: list[str], seed: int = 0) -> Trainer:
    return Trainer(_data(c), _tiny_model(seed), shared_keys, batch_size=8, eval_batch_size=8, augment=False)


def _one_step_change(
    proximal: object, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Train one SGD step from the same weights with and without the proximal term; return the difference."""
    shared = [k for _, keys in UNITS[:2] for k in keys]
    params = [k for k in shared if "running" not in k and "num_batches" not in k]
    centre = {k: v + 0.5 for k, v in _tiny_model(1).state_dict().items() if k in shared}
    lr = 0.1
    after: list[dict[str, torch.Tensor]] = []
    for mu in (LAM / ALPHA_K, 0.0):
        monkeypatch.setattr(client_module, "proximal_term", proximal)
        client = _client(0, shared)
        start = {k: v.clone() for k, v in client.model.state_dict().items()}
        recipe = Recipe(epochs=1, lr=lr, prox_mu=mu)  # no momentum, no weight decay: one plain SGD step
        client.train(TrainInstruction(client=0, recipe=recipe, prox_centre=centre), server_round=2, seed=7)
        after.append(client.model.state_dict())
    diff = {k: after[0][k] - after[1][k] for k in params}
    # one step of SGD on the extra term: -lr * lambda/alpha_K * (rho - p_i), rho being the starting weights
    expected = {k: -lr * (LAM / ALPHA_K) * (start[k] - centre[k]) for k in params}
    return diff, expected


def test_the_client_really_descends_the_proximal_term(monkeypatch: pytest.MonkeyPatch) -> None:
    diff, expected = _one_step_change(proximal_term, monkeypatch)
    assert any(float(d.abs().max()) > 0.01 for d in diff.values())
    for key, value in diff.items():
        assert torch.allclose(value, expected[key], atol=1e-5), key


def test_a_detached_proximal_term_would_fail_the_same_check(monkeypatch: pytest.MonkeyPatch) -> None:
    diff, expected = _one_step_change(_detached_proximal_term, monkeypatch)
    assert every(float(d.abs().max()) == 0.0 for d in diff.values())  # it trains exactly like local-only
    assert not all(torch.allclose(v, expected[k], atol=1e-5) for k, v in diff.items())


def test_the_head_never_leaves_a_client() -> None:
    model = _tiny_model(0)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ctx = StrategyContext(
        hospitals=(0, 1, 2),
        num_examples={0: 8, 1: 8, 2: 8},
        state_keys=tuple(initial),
        units=UNITS,
        initial_state=initial,
    )
    amp = AmpSettings(alpha_k=0.4, sigma=1.0, lam=0.01, dm="euclidean", scale="relative")
    recipe = Recipe(epochs=1, lr=0.05, head_epochs=1, prox_mu=amp.prox_mu, fisher_batch=4)
    params = {n for n, _ in model.named_parameters()}
    strategy = AttentiveStrategy("fedsaf", amp=amp, nhead=1, fim=True, recipe=recipe, ctx=ctx, param_keys=params)
    shared = strategy.keys
    assert set(shared) == set(initial) - HEAD
    clients = {c: _client(c, shared) for c in range(3)}
    heads_before = {c: clients[c].model.state_dict()["5.weight"].clone() for c in range(3)}
    for server_round in (1, 2):
        plan = strategy.configure_train(server_round, [0, 1, 2])
        assert sorted(plan) == [0, 1, 2]
        replies = {}
        for c, instruction in plan.items():
            for message in (instruction.shared, instruction.centre):
                assert message is not None
                assert set(message) == set(shared)
            replies[c] = clients[c].train(instruction, server_round, seed=server_round * 10 + c)
            assert set(replies[c].shared) == set(shared)
            assert replies[c].metrics["fisher_trace"] > 0
        record = strategy.aggregate_train(server_round, replies)
        assert len(record["gamma"]) == 3
        assert not any(k.endswith(tuple(HEAD)) for k in strategy.state_tensors())
    for c in range(3):
        # each head trained locally (Eq. 24) and stayed different from the others
        assert not torch.equal(clients[c].model.state_dict()["5.weight"], heads_before[c])
    assert not torch.equal(clients[0].model.state_dict()["5.weight"], clients[1].model.state_dict()["5.weight"])
