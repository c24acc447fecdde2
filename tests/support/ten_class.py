"""A real, tiny 10-class run (issue 51) for the HTML report and the dashboard: the first 240 training and 60 test
images of Debian's dataset-fashion-mnist, prepared over 2 hospitals (``prepare --format idx``, PFLlib's ``pat``
partition) and trained for 2 rounds of FedAvg with PFLlib's small CNN (``fedavg_cnn``) on the CPU, as a user runs
it, under ``<root>/prepared/fmnist`` and ``<root>/runs/<RUN_NAME>`` (the dashboard's data root layout)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.idx import FASHION_MNIST_DIR, write_subset
from support.cli import run_cli

RUN_NAME = "20250101-000000-fedavg"
CLASSES = [str(c) for c in range(10)]


@dataclass(frozen=True)
class TenClassRun:
    """The data root, its prepared 10-class dataset and the finished run."""

    root: Path
    dataset: Path
    run: Path

    def hospital(self, index: int) -> Path:
        return self.run / "hospitals" / f"client_{index:02d}"


def build_ten_class_run(root: Path) -> TenClassRun:
    """Prepare and train the run (about 15 s on two CPU cores); fails, saying so, where the images are absent."""
    if not FASHION_MNIST_DIR.is_dir():
        pytest.fail(f"{FASHION_MNIST_DIR} is missing: install Debian's package dataset-fashion-mnist (scripts/test.sh)")
    raw = root / "raw"
    write_subset(FASHION_MNIST_DIR, raw, {"train": 240, "t10k": 60})
    dataset = root / "prepared" / "fmnist"
    run = root / "runs" / RUN_NAME
    prepare = ["prepare", "--format", "idx", "--input", str(raw), "--out", str(dataset), "--clients", "2"]
    prepare += ["--partition", "pat:10", "--test-fraction", "0.25", "--tile", "28", "--background-max", "1"]
    settings = ["run.rounds=2", "model.name=fedavg_cnn", "data.input_size=28", "data.batch_size=16"]
    settings += ["data.augment=false", "client.lr=0.05", "strategy.name=fedavg", "run.workers=0"]
    train = ["train", "--data", str(dataset), "--out", str(run)]
    for setting in settings:
        train += ["--set", setting]
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert run_cli(monkeypatch, *prepare, "--seed", "1", "--no-progress") == 0
        assert run_cli(monkeypatch, *train) == 0
    assert json.loads((run / "summary.json").read_text(encoding="utf-8"))["classes"] == CLASSES
    return TenClassRun(root, dataset, run)
