"""FedRep (Collins et al., 2021; a baseline of FedSAF paper 001, Table 7).

The last ``nhead`` layer units (default 1: the classifier) are each client's own head and never leave it; the
rest is a shared representation. Each round a client first trains its head for ``client.head_epochs`` with the
representation frozen, then the representation for ``client.epochs`` with the head frozen (the same two steps
as FedSAF's Eq. 24-25, without the proximal term); the server averages the representations weighted by
training tiles and sends the average back.
"""

from __future__ import annotations

from federation.config import RunConfig
from federation.errors import FederationError
from federation.methods import SPEC
from federation.strategies.context import StrategyContext, recipe_from_config, resolved_nhead
from federation.strategies.fedavg import Averaging


def build(config: RunConfig, ctx: StrategyContext) -> Averaging:
    """FedRep: head epochs, then base epochs; only the base is averaged."""
    nhead = resolved_nhead(config)
    least = SPEC["fedrep"].min_nhead
    if nhead < least:
        raise FederationError(f"fedrep needs a local head: set strategy.nhead >= {least} (or use fedavg for nhead 0)")
    if config.client.head_epochs < 1:
        raise FederationError("fedrep trains the head first: set client.head_epochs >= 1")
    recipe = recipe_from_config(config, head_epochs=config.client.head_epochs)
    return Averaging("fedrep", recipe, nhead, ctx, server=config.server)
