"""Builders for the dashboard tests: a tiny prepared dataset and run directories written exactly as
data/README.md documents them (sections 2 and 3), with unequal per-hospital figures so that a test can tell
one hospital from another, the mean from the last value, and a finished run from a failed one."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from streamlit.testing.v1 import AppTest

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "dashboard" / "main.py")

# Hospital 2 is the grayscale one; its test split in round 1 holds one class, so its AUC is null there.
METRICS = [
    # round, client, train_loss, test_loss, test_acc, test_auc, fisher, sent, received, seconds
    (1, 0, 0.70, 0.66, 0.50, 0.625, 1.5, 1000, 1000, 2.0),
    (1, 1, 0.68, 0.61, 0.75, 0.8125, 2.5, 1000, 1000, 3.0),
    (1, 2, 0.71, 0.69, 0.25, None, 4.0, 1000, 1000, 1.0),
    (2, 0, 0.52, 0.45, 0.75, 0.875, 1.0, 900, 900, 2.5),
    (2, 1, 0.49, 0.40, 1.00, 0.9375, 3.0, 900, 900, 3.5),
    (2, 2, 0.55, 0.50, 0.50, 0.6875, 2.0, 900, 900, 1.5),
]
XI = [
    [[0.9, 0.06, 0.04], [0.05, 0.9, 0.05], [0.02, 0.08, 0.9]],
    [[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]],
]


def open_page(name: str, state: dict[str, object] | None = None, timeout: float = 90) -> AppTest:
    """The dashboard run through AppTest with ``state`` in its session, switched to ``views/<name>.py`` (it opens on
    the Verdict page when a finished run exists, else on the Data page), with no exception raised on the way."""
    at = AppTest.from_file(MAIN, default_timeout=timeout)
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.run()
    at.switch_page(f"views/{name}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@dataclass(frozen=True)
class Fixture:
    """Paths of the fixture data root and what is inside it."""

    root: Path
    dataset: Path
    finished: Path
    failed: Path
    grid: Path


def wait_until(predicate: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Poll ``predicate`` every 50 ms until it holds; fail after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def write_prepared(dataset: Path, clients: int = 3, per_class: int = 2) -> None:
    """A prepared dataset: ``per_class`` 16 px tiles per client x split x label, manifest.csv and prepare.json."""
    rng = np.random.default_rng(0)
    rows = []
    for client in range(clients):
        gray = client == clients - 1
        for split in ("train", "test"):
            for label in ("normal", "abnormal"):
                folder = dataset / f"client_{client:02d}" / split / label
                folder.mkdir(parents=True, exist_ok=True)
                for i in range(per_class):
                    shade = 200 if label == "normal" else 90
                    pixels = np.clip(rng.normal(shade, 20, (16, 16, 3)), 0, 255).astype(np.uint8)
                    image = Image.fromarray(pixels).convert("L") if gray else Image.fromarray(pixels)
                    name = f"s{client}{split[:2]}{label[:2]}{i}.png"
                    image.save(folder / name)
                    rows.append(
                        {
                            "client": client,
                            "split": split,
                            "label": label,
                            "path": f"client_{client:02d}/{split}/{label}/{name}",
                            "source": f"slide_{client}_{split}_{label}.png",
                            "x": 16 * i,
                            "y": 0,
                            "size": 64,
                            "white_ratio": 0.1,
                            "channels": 1 if gray else 3,
                        }
                    )
    with (dataset / "manifest.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (dataset / "prepare.json").write_text(
        json.dumps({"config": {"tile": 64, "clients": clients}, "counts": {}, "versions": {}}), encoding="utf-8"
    )


def write_config(run: Path, dataset: Path, strategy: str = "fedsaf", nhead: int = 2, dm: str = "manhattan") -> None:
    """The resolved config.toml, in federation.config's layout."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.toml").write_text(
        f'[run]\nname = "run"\nseed = 0\nrounds = 2\n\n[data]\npath = "{dataset}"\ninput_size = 32\n\n'
        f'[strategy]\nname = "{strategy}"\nclients = "all"\nnhead = {nhead}\n\n'
        f'[amp]\nalpha_k = 0.02\nsigma = 0.1\nlam = 1.0\ndm = "{dm}"\n\n[fedsaf]\nfim = true\nsplit = true\n',
        encoding="utf-8",
    )


def write_metrics(run: Path, scale: float = 1.0) -> None:
    """metrics.jsonl (documented fields) and aggregation.jsonl with the AMP matrix xi per round."""
    keys = ("round", "client", "train_loss", "test_loss", "test_acc", "test_auc", "fisher_trace")
    keys += ("values_sent", "values_received", "seconds")
    with (run / "metrics.jsonl").open("w") as f:
        for row in METRICS:
            record = dict(zip(keys, row, strict=True))
            if scale != 1.0:
                record["test_acc"] = float(record["test_acc"]) * scale  # type: ignore[arg-type]
            record.update({"num_train": 4, "num_test": 4})
            f.write(json.dumps(record) + "\n")
    with (run / "aggregation.jsonl").open("w") as f:
        for r, xi in enumerate(XI, start=1):
            f.write(json.dumps({"round": r, "xi": xi, "gamma": [0.2, 0.3, 0.5]}) + "\n")


def write_predictions(run: Path, dataset: Path) -> None:
    """Each hospital's predictions.csv (in its folder): its test tiles with an unequal, hand-checkable probability."""
    probs = {"normal": [0.2, 0.7], "abnormal": [0.9, 0.4]}
    for client in range(3):
        lines = ["client,path,label,prob_abnormal"]
        for label in ("normal", "abnormal"):
            for i in range(2):
                path = f"client_{client:02d}/test/{label}/s{client}te{label[:2]}{i}.png"
                assert (dataset / path).is_file()
                lines.append(f"{client},{path},{label},{probs[label][i]}")
        folder = run / "hospitals" / f"client_{client:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "predictions.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_summary(run: Path, status: str, error: str | None = None) -> None:
    """summary.json with the documented status (and error for a failed run)."""
    summary: dict[str, object] = {"status": status, "total_rounds": 2, "eta_seconds": None}
    if error:
        summary["error"] = error
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


def write_running(fx: Fixture) -> Path:
    """A run of 5 rounds still training at round 2 (about 95 s left): the finished run's first 2 rounds, copied."""
    run = fx.root / "runs" / "20250101-000200-fedsaf"
    run.mkdir()
    for name in ("config.toml", "metrics.jsonl", "aggregation.jsonl"):
        (run / name).write_text((fx.finished / name).read_text())
    (run / "config.toml").write_text((run / "config.toml").read_text().replace("rounds = 2", "rounds = 5"))
    (run / "summary.json").write_text(json.dumps({"status": "running", "total_rounds": 5, "eta_seconds": 95}))
    return run


def build(root: Path) -> Fixture:
    """The whole fixture data root."""
    dataset = root / "prepared" / "tiny"
    write_prepared(dataset)
    runs = root / "runs"
    finished = runs / "20250101-000000-fedsaf"
    write_config(finished, dataset)
    write_metrics(finished)
    write_predictions(finished, dataset)
    write_summary(finished, "finished")
    failed = runs / "20250101-000100-fedsaf"
    write_config(failed, dataset)
    write_summary(failed, "failed", 'CUDA is not available: set run.device = "cpu"')
    grid = write_grid(root / "ablations" / "grid-demo", dataset)
    return Fixture(root, dataset, finished, failed, grid)


def write_grid(grid: Path, dataset: Path) -> Path:
    """A 2 x 2 ablation grid (nhead 0, 2 x dm manhattan, euclidean; seed 0) as ``gastric-fl ablate`` lays it out,
    finished runs on ``dataset`` whose best averaged ACC is 0.75 x (0.5 + 0.1 nhead, + 0.05 for euclidean)."""
    cells = []
    for nhead in (0, 2):
        for dm in ("manhattan", "euclidean"):
            cell_id = f"nhead-{nhead}_dm-{dm}_seed-0"
            run = grid / "cells" / cell_id
            write_config(run, dataset, nhead=nhead, dm=dm)
            write_metrics(run, scale=0.5 + 0.1 * nhead + (0.05 if dm == "euclidean" else 0.0))
            write_summary(run, "finished")
            cells.append(
                {
                    "id": cell_id,
                    "block": 0,
                    "params": {"nhead": nhead, "dm": dm},
                    "seed": 0,
                    "run_dir": f"cells/{cell_id}",
                    "same_as": None,
                    "status": "finished",
                    "error": None,
                }
            )
    (grid / "ablation.json").write_text(json.dumps({"version": 1, "cells": cells}), encoding="utf-8")
    return grid
