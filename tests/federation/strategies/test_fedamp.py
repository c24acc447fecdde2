"""FedAMP (Huang et al., AAAI 2021) as FedSAF's server without splitting or FIM: u_i = z_i, proximal client."""

from __future__ import annotations

import pytest
import torch

from federation.config import RunConfig, config_from_dict
from federation.errors import FederationError
from federation.strategies import build_strategy
from federation.strategies.context import StrategyContext
from federation.wire.contract import TrainReply, count_values
from models import create_model, split_units


def _ctx() -> tuple[StrategyContext, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small", num_classes=2)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ctx = StrategyContext(
        hospitals=(0, 1, 2),
        num_examples={0: 4, 1: 6, 2: 8},
        state_keys=tuple(state),
        units=tuple(split_units(model)),
        initial_state=state,
    )
    return ctx, state


def _config(**amp: object) -> RunConfig:
    values: dict[str, object] = {"alpha_k": 0.25, "sigma": 1.0, "lam": 0.5, "scale": "raw"}  # amp.dm is FedSAF's
    values.update(amp)
    return config_from_dict({"strategy": {"name": "fedamp"}, "amp": values})


def test_fedamp_shares_everything_with_a_proximal_single_phase_recipe() -> None:
    ctx, state = _ctx()
    strategy = build_strategy(_config(), ctx)
    plan = strategy.configure_train(1, [0, 1, 2])
    recipe = plan[0].recipe
    assert recipe.head_epochs == 0  # Eq. 23: one phase over all parameters
    assert recipe.fisher_batch == 0  # no FIM
    assert recipe.prox_mu == pytest.approx(0.5 / 0.25)  # lambda / alpha_k
    assert count_values(plan[0]) == sum(v.numel() for v in state.values())


def test_fedamp_gives_each_client_its_own_u_equal_to_z() -> None:
    ctx, state = _ctx()
    strategy = build_strategy(_config(), ctx)
    weight = "features.0.0.weight"  # 16 x 3 x 3 x 3 = 432 values
    # Client c moves one value of that tensor by delta_c; all else stays at the initial weights, so
    # d_12 = (0.3 - 0.5)^2 = 0.04, d_13 = (0.3 - 1.0)^2 = 0.49, d_23 = (0.5 - 1.0)^2 = 0.25
    deltas = [0.3, 0.5, 1.0]
    replies = {}
    for c, delta in enumerate(deltas):
        shared = {k: v.clone() for k, v in state.items()}
        shared[weight].view(-1)[0] += delta
        replies[c] = TrainReply(client=c, shared=shared, num_examples=4 + 2 * c, metrics={})
    record = strategy.aggregate_train(1, replies)
    # xi_ij = 0.25 * exp(-d_ij) / 1: xi_12 = 0.25 e^-0.04 = 0.2401974, xi_13 = 0.25 e^-0.49 = 0.1531566,
    # xi_23 = 0.25 e^-0.25 = 0.1947002; xi_11 = 1 - 0.2401974 - 0.1531566 = 0.6066460
    assert record["xi"][0][1] == pytest.approx(0.2401974, abs=1e-6)
    assert record["xi"][0][0] == pytest.approx(0.6066460, abs=1e-6)
    assert "gamma" not in record
    plan = strategy.configure_train(2, [0, 1, 2])
    first = state[weight].view(-1)[0].item()
    # u_1 moves that value by 0.6066460 * 0.3 + 0.2401974 * 0.5 + 0.1531566 * 1.0 = 0.1819938 + 0.1200987 + 0.1531566
    #   = 0.4552491; u_2 by 0.2401974 * 0.3 + (1 - 0.2401974 - 0.1947002) * 0.5 + 0.1947002 * 1.0
    #   = 0.0720592 + 0.2825512 + 0.1947002 = 0.5493106
    moved = [plan[c].shared[weight].view(-1)[0].item() - first for c in range(3)]  # type: ignore[index]
    assert moved[0] == pytest.approx(0.4552491, abs=1e-5)
    assert moved[1] == pytest.approx(0.5493106, abs=1e-5)
    assert moved[0] != pytest.approx(moved[2], abs=1e-3)  # personalised: not one global model
    assert plan[0].centre_is_shared  # the start is the centre: sent once
    assert plan[0].centre is plan[0].shared


def test_fedamp_rejects_a_local_head_and_unsafe_alpha() -> None:
    ctx, _ = _ctx()
    config = config_from_dict({"strategy": {"name": "fedamp", "nhead": 2}, "amp": {"alpha_k": 0.1, "sigma": 1.0}})
    with pytest.raises(FederationError, match="fedamp shares the whole model"):
        build_strategy(config, ctx)
    with pytest.raises(FederationError, match=r"self-weight xi_ii negative"):
        build_strategy(_config(alpha_k=0.6), ctx)
