"""FedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021), a baseline of
FedSAF paper 001 (Tables 3, 6, 7).

The server's Attentive Message Passing gives each client its own cloud model
``u_i = z_i = sum_j xi_ij rho_j`` with ``xi_ij = alpha_k A'(d_ij)`` (``i != j``) and ``xi_ii = 1 - sum_{j != i} xi_ij``
(FedSAF Eq. 3-8, 16-18; FedAMP Eq. 5-6, where alpha_k is the step size of the gradient step on the attention
term). Each client then solves ``min F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2`` (FedAMP Eq. 7), starting
from ``u_i``, with a real gradient on the proximal term. No model splitting, no Fisher reweighting: the whole
model is shared. It is FedSAF's server with both components off (``federation/strategies/fedsaf.py``), with
FedAMP's own distance ``fedamp.dm`` (squared L2, FedAMP Eq. 5-6) instead of FedSAF's ``amp.dm``; ``alpha_k``,
``sigma``, ``lambda`` and the distance scale are the shared ``[amp]`` settings.
"""

from __future__ import annotations

import dataclasses

from federation.config import RunConfig
from federation.errors import FederationError
from federation.methods import SPEC
from federation.strategies.context import StrategyContext, recipe_from_config, resolved_nhead
from federation.strategies.fedsaf import AmpSettings, AttentiveStrategy, trainable_keys


def build(config: RunConfig, ctx: StrategyContext) -> AttentiveStrategy:
    """FedAMP with the ``[amp]`` settings; ``strategy.nhead`` must be 0 (FedAMP shares the whole model)."""
    nhead = resolved_nhead(config)
    fixed = SPEC["fedamp"].fixed_nhead
    if nhead != fixed:
        raise FederationError(
            f"fedamp shares the whole model, so strategy.nhead must be {fixed} (got {nhead}); for AMP with a local "
            "head use strategy.name = fedsaf with fedsaf.fim = false"
        )
    # FedAMP's own distance (fedamp.dm, squared L2 by default), not FedSAF's amp.dm
    amp = dataclasses.replace(AmpSettings.from_config(config), dm=config.fedamp.dm)
    recipe = recipe_from_config(config, prox_mu=amp.prox_mu)
    return AttentiveStrategy(
        "fedamp",
        amp=amp,
        nhead=0,
        fim=False,
        recipe=recipe,
        ctx=ctx,
        param_keys=trainable_keys(config),
        max_weight=config.server.max_weight,
    )
