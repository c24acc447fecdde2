"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization", ICLR 2021).

FedAvg in which every BatchNorm layer's running statistics *and* affine parameters stay at the hospital: they
never appear in a message (``strategy.bn`` is fixed to ``"local"`` for this method, ``federation.strategies.
FORCED_BN``), so each hospital normalises its features with its own stain and scanner statistics while the
convolutions and the classifier are averaged with ``n_i / n`` as in FedAvg. With ``strategy.bn = "local"``, any
averaging method gets the same treatment; ``fedbn`` is FedAvg with it.
"""

from __future__ import annotations

from federation.config import RunConfig
from federation.strategies.context import StrategyContext, recipe_from_config, resolved_nhead
from federation.strategies.fedavg import Averaging


def build(config: RunConfig, ctx: StrategyContext) -> Averaging:
    """FedBN: FedAvg over everything but BatchNorm (the engine keeps BatchNorm keys out of ``ctx``'s shared keys)."""
    return Averaging("fedbn", recipe_from_config(config), resolved_nhead(config), ctx, server=config.server)
