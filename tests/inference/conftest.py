"""A tiny trained run on a synthetic SEED set (synth -> prepare -> 1 federated round), shared by the tests here."""

from __future__ import annotations

import json

import pytest
from support.slides import TinyRun, train_tiny


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """8 synthetic SEED slides of 256 px, 2 hospitals (hospital 1 gray), 64 px tiles, one round of FedAvg."""
    root = tmp_path_factory.mktemp("inference")
    raw, prepared, run = root / "raw", root / "prepared", root / "run"
    train_tiny(raw, prepared, run)
    record = json.loads((prepared / "prepare.json").read_text(encoding="utf-8"))
    return TinyRun(raw=raw, prepared=prepared, run=run, record=record)
