"""A data root with a tiny *trained* run, for the Slide page and the HTML report: real model bundles, real
``prepare.json`` slides and raw files, so that scoring a slide is ``gastric-fl predict`` itself.

8 synthetic SEED slides of 256 px, 2 hospitals (hospital 1 gray), 64 px tiles, one round of FedAvg at 32 px input:
the same set-up as tests/inference (a few seconds on 2 CPU cores)."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from federation.config import load_config
from federation.launch import train
from federation.runfiles import hospital_dir
from pipeline.config import build_config
from pipeline.prepare import prepare_dataset
from pipeline.synth import generate_dataset

RUN_ID = "20260101-000000-fedavg"


@dataclass(frozen=True)
class TrainedRoot:
    """A data root (``raw/``, ``prepared/``, ``runs/``) holding one finished run with exported bundles."""

    root: Path
    raw: Path
    prepared: Path
    run: Path

    def hospital(self, client: int) -> Path:
        return hospital_dir(self.run, client)

    def record(self) -> dict:
        return json.loads((self.prepared / "prepare.json").read_text(encoding="utf-8"))

    def test_slides(self, client: int, label: str) -> list[str]:
        """Sources of the hospital's test slides of ``label`` that gave tiles, in prepare.json's order."""
        return slide_sources(self.record(), client, "test", label)

    def evaluated(self, client: int, source: str) -> dict[tuple[int, int], float]:
        """``(x, y) -> P(abnormal)`` of predictions.csv for the tiles the run evaluated from ``source``."""
        with (self.prepared / "manifest.csv").open(newline="", encoding="utf-8") as handle:
            manifest = {r["path"]: r for r in csv.DictReader(handle)}
        with (self.hospital(client) / "predictions.csv").open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        return {
            (int(manifest[r["path"]]["x"]), int(manifest[r["path"]]["y"])): float(r["prob_abnormal"])
            for r in rows
            if manifest[r["path"]]["source"] == source
        }


def slide_sources(record: dict, client: int, split: str, label: str) -> list[str]:
    """Sources of the hospital's ``split`` slides of ``label`` that gave tiles, in the prepare record's order."""
    return [
        s["source"]
        for s in record["slides"]
        if s["client"] == client and s["split"] == split and s["label"] == label and s["tiles"] > 0
    ]


def train_tiny(raw: Path, prepared: Path, run: Path, size: int = 256, rounds: int = 1) -> None:
    """synth (8 SEED slides of ``size`` px) -> prepare (2 hospitals, hospital 1 gray, 64 px tiles) -> ``rounds``
    rounds of FedAvg at 32 px input into ``run``.

    The classic tissue: these tests exercise predict, the pages and the reports, which need a model whose tile
    probabilities spread on both sides of a threshold after one round on 8 slides; on the gastric tissue a model
    must read morphology, which takes far more tiles and rounds than a fixture can afford (docs/synthetic-data.md).
    """
    generate_dataset(raw, "seed", images=8, seed=4, size=size, tissue="classic")
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
    settings = [f"run.rounds={rounds}", "run.threads=1", "data.input_size=32", "data.batch_size=8",
                "data.eval_batch_size=64", "client.epochs=1"]  # fmt: skip
    train(load_config(None, settings, data=prepared), run, progress=False)


def build_trained_root(root: Path, size: int = 256, rounds: int = 1) -> TrainedRoot:
    """synth -> prepare -> ``rounds`` rounds of training, laid out as a dashboard data root (``size``: slide side)."""
    raw, prepared, run = root / "raw" / "tiny", root / "prepared" / "tiny", root / "runs" / RUN_ID
    train_tiny(raw, prepared, run, size, rounds)
    return TrainedRoot(root, raw, prepared, run)


def copy_root(source: TrainedRoot, root: Path) -> TrainedRoot:
    """A fresh data root whose run is a copy of ``source``'s (the dataset and raw slides are shared, read-only)."""
    run = root / "runs" / RUN_ID
    shutil.copytree(source.run, run, ignore=shutil.ignore_patterns("checkpoints", "slides", "report.html"))
    return TrainedRoot(root, source.raw, source.prepared, run)


@dataclass(frozen=True)
class TinyRun:
    """Where the fixture's raw slides, prepared dataset and run are, and prepare's record."""

    raw: Path
    prepared: Path
    run: Path
    record: dict

    def bundle(self, client: int) -> Path:
        return hospital_dir(self.run, client)

    def slides(self, client: int, split: str, label: str) -> list[str]:
        return slide_sources(self.record, client, split, label)
