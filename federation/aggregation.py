"""The public aggregation functions at their published name (docs/design.md, "Public names"): each is defined
beside the method that uses it in ``federation.strategies`` and re-exported here unchanged, so tools written
against ``federation.aggregation`` keep working.

- ``amp_coefficients`` (FedSAF paper 001, Eq. 3-8; ``federation.strategies.amp``),
- ``fisher_weights`` (Eq. 12-15; ``federation.strategies.fisher_weights``),
- ``weighted_sum`` (``federation.strategies.aggregation``),
- ``depthwise_fisher_weights`` (paper 000; ``federation.strategies.depthwise_fim``),
- ``lws_factors`` (paper 002; ``federation.strategies.wrappers.fedlws``),
- ``tlu_scores`` (paper 003; ``federation.strategies.wrappers.fedtlu``),
- ``precision_weighted_sum`` (paper 004, Eq. 6; ``federation.strategies.precision_weighted``).
"""

from federation.strategies.aggregation import weighted_sum
from federation.strategies.amp import amp_coefficients
from federation.strategies.depthwise_fim import depthwise_fisher_weights
from federation.strategies.fisher_weights import fisher_weights
from federation.strategies.precision_weighted import precision_weighted_sum
from federation.strategies.wrappers.fedlws import lws_factors
from federation.strategies.wrappers.fedtlu import tlu_scores

__all__ = [
    "amp_coefficients",
    "depthwise_fisher_weights",
    "fisher_weights",
    "lws_factors",
    "precision_weighted_sum",
    "tlu_scores",
    "weighted_sum",
]
