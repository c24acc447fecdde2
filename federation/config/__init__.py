"""Run configuration: one frozen dataclass per concern, defaults in TOML, ``--set section.key=value`` overrides.

The sections mirror the FedSAF paper's hyper-parameters (paper 001, Sec. 3-4): ``[strategy] nhead`` is the
number of layer units kept local (Eq. 1), ``[amp]`` holds alpha_k, sigma, lambda and the distance ``dm`` of
Eq. 3-8 and 16-18, ``[fedsaf]`` toggles the Fisher reweighting (Eq. 12-15, 19-20) and the model splitting.
``[depthwise_fim]``, ``[fedlws]`` and ``[fedtlu]`` set the seed methods of papers 000, 002 and 003
(docs/methods.md); ``strategy.wrap`` lists the post-processing steps (FedLWS, FedTLU) applied to a strategy.
``[server]`` holds the server's own safeguards: ``max_weight`` caps any one hospital's weight in every method's
aggregate, ``robust`` picks a robust aggregation for the averaging methods, ``max_examples`` bounds a Hello's counts.
A method added later declares its own section in its spec instead (`federation.methods.Setting`): the section's
class, its defaults and checks, and its refusal for the other methods are built from the declaration, and read as
``config.section("<method>")``.

Loading is strict: an unknown section or key, a value of the wrong type, or a value out of range is rejected
with a ``FederationError`` that names it and says what is allowed. The defaults live in ``DEFAULTS_TOML``; a
preset in ``configs/`` only lists what it changes.

The package has three parts, all re-exported here: ``defaults`` (``DEFAULTS_TOML`` and the choices of the
enumerated fields), ``sections`` (the section dataclasses with their checks, those the methods declare, ``RunConfig``,
``SECTIONS`` and the rules that need the number of hospitals) and ``load`` (``load_config``, ``--set`` parsing,
merging, and ``config_to_toml``).

Checking a configuration imports no torch: the names it checks against come from the torch-free leaves
`models.names` and `federation.methods` (the strategy registry), so the dashboard's form can check settings at once.
"""

from __future__ import annotations

from federation.config.defaults import (
    AMP_METRICS,
    AMP_SCALES,
    BN_MODES,
    DEFAULTS_TOML,
    DEVICES,
    DP_UNITS,
    ENGINES,
    FISHER_ESTIMATORS,
    NORMS,
    OPTIMIZERS,
    ROBUST_METHODS,
    STARTS,
    TLU_GROUPINGS,
)
from federation.config.load import (
    config_from_dict,
    config_to_toml,
    load_config,
    parse_override,
    read_toml,
    resolve_config,
    with_values,
)
from federation.config.sections import (
    MAX_COUNT,
    SECTIONS,
    AdamSection,
    AmpSection,
    DataSection,
    DepthwiseFIMSection,
    FedAMPSection,
    FedLWSSection,
    FedProxSection,
    FedSAFSection,
    FedTLUSection,
    FlowerSection,
    HospitalSection,
    ModelSection,
    PrecisionWeightedSection,
    PrivacySection,
    RunConfig,
    RunSection,
    ServerSection,
    StrategySection,
)

__all__ = [
    "AMP_METRICS",
    "AMP_SCALES",
    "BN_MODES",
    "DEFAULTS_TOML",
    "DEVICES",
    "DP_UNITS",
    "ENGINES",
    "FISHER_ESTIMATORS",
    "MAX_COUNT",
    "NORMS",
    "OPTIMIZERS",
    "ROBUST_METHODS",
    "SECTIONS",
    "STARTS",
    "TLU_GROUPINGS",
    "AdamSection",
    "AmpSection",
    "DataSection",
    "DepthwiseFIMSection",
    "FedAMPSection",
    "FedLWSSection",
    "FedProxSection",
    "FedSAFSection",
    "FedTLUSection",
    "FlowerSection",
    "HospitalSection",
    "ModelSection",
    "PrecisionWeightedSection",
    "PrivacySection",
    "RunConfig",
    "RunSection",
    "ServerSection",
    "StrategySection",
    "config_from_dict",
    "config_to_toml",
    "load_config",
    "parse_override",
    "read_toml",
    "resolve_config",
    "with_values",
]
