"""Everything federated: manifest loading, client recipes, aggregation maths, strategies and engines.

Nothing of the product contacts anything but the federation's own addresses (docs/design.md, "Trust model"): importing
this package turns off, for this process and every process it starts, the update checks and usage statistics of
the libraries it uses (albumentations checks PyPI at import; Flower and Ray send telemetry; the Hugging Face hub,
through timm, would fetch weights). Set before any of them is imported, and not left to the user's environment.
"""

import os

OFFLINE_ENV: dict[str, str] = {
    "NO_ALBUMENTATIONS_UPDATE": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
os.environ.update(OFFLINE_ENV)
