"""A tiny trained run on a synthetic SEED set (synth -> prepare -> 1 federated round), shared by the tests here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from federation.config import load_config
from federation.engine import train
from pipeline.config import build_config
from pipeline.prepare import prepare_dataset
from pipeline.synth import generate_dataset


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
        return [
            s["source"]
            for s in self.record["slides"]
            if s["client"] == client and s["split"] == split and s["label"] == label and s["tiles"] > 0
        ]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """8 synthetic SEED slides of 256 px, 2 hospitals (hospital 1 gray), 64 px tiles, one round of FedAvg."""
    root = tmp_path_factory.mktemp("inference")
    raw, prepared, run = root / "raw", root / "prepared", root / "run"
    generate_dataset(raw, "seed", images=8, seed=4, size=256)
    prepare_dataset(
        build_config(
            None,
            {
                "source": {"format": "seed", "input": raw},
                "split": {"clients": 2, "sizes": "equal", "test_fraction": 0.4},
                "tiles": {"tile": 64, "white_max": 0.4},
                "clients": {"grayscale": [1]},
                "output": {"out": prepared, "progress": False},
            },
        )
    )
    settings = [
        "run.rounds=1",
        "run.threads=1",
        "data.input_size=32",
        "data.batch_size=8",
        "data.eval_batch_size=64",
        "client.epochs=1",
    ]
    train(load_config(None, settings, data=prepared), run, progress=False)
    record = json.loads((prepared / "prepare.json").read_text(encoding="utf-8"))
    return TinyRun(raw=raw, prepared=prepared, run=run, record=record)
