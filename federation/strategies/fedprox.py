"""FedProx (Li et al., 2020; a baseline of FedSAF paper 001, Table 7).

FedAvg's server with a proximal client: each client minimises ``F_i(w) + mu/2 ||w - w_global||^2`` over the
shared parameters, the centre being the global weights it received this round (``[fedprox] mu``). The term is
part of the loss, so its gradient ``mu (w - w_global)`` really reaches the optimiser (``federation.hospital.trainer``).
"""

from __future__ import annotations

from federation.config import RunConfig
from federation.strategies.context import StrategyContext, recipe_from_config, resolved_nhead
from federation.strategies.fedavg import Averaging


def build(config: RunConfig, ctx: StrategyContext) -> Averaging:
    """FedProx: FedAvg aggregation, clients pulled towards the global weights with strength ``fedprox.mu``."""
    recipe = recipe_from_config(config, prox_mu=config.fedprox.mu)
    return Averaging("fedprox", recipe, resolved_nhead(config), ctx, server=config.server)
