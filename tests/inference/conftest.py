"""A tiny trained run on a synthetic SEED set (synth -> prepare -> 1 federated round), shared by the tests here."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "app"))  # the shared tiny run (last: `conftest` stays ours)
from slide_fixtures import slide_sources, train_tiny


@dataclass(frozen=True)
class TinyRun:
    """Where the fixture's raw slides, prepared dataset and run are, and prepare's record."""

    raw: Path
    prepared: Path
    run: Path
    record: dict

    def bundle(self, client: int) -> Path:
        return self.run / "hospitals" / f"client_{client:02d}"

    def slides(self, client: int, split: str, label: str) -> list[str]:
        return slide_sources(self.record, client, split, label)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """8 synthetic SEED slides of 256 px, 2 hospitals (hospital 1 gray), 64 px tiles, one round of FedAvg."""
    root = tmp_path_factory.mktemp("inference")
    raw, prepared, run = root / "raw", root / "prepared", root / "run"
    train_tiny(raw, prepared, run)
    record = json.loads((prepared / "prepare.json").read_text(encoding="utf-8"))
    return TinyRun(raw=raw, prepared=prepared, run=run, record=record)
