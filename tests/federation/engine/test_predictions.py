"""predictions.csv carries the exact probabilities the engine's test_auc was computed from."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from sklearn.metrics import roc_auc_score
from support.tiny_dataset import TINY_SETTINGS, make_dataset

from federation.config import load_config
from federation.launch import train


def test_auc_from_predictions_csv_equals_test_auc_in_metrics(tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    train(load_config(None, [*TINY_SETTINGS, "run.rounds=1"], data=dataset), run_dir, progress=False)
    metrics = {m["client"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    rows = []
    for path in sorted((run_dir / "hospitals").glob("client_*/predictions.csv")):
        with path.open(newline="") as handle:
            rows += list(csv.DictReader(handle))
    checked = 0
    for client, line in metrics.items():
        mine = [r for r in rows if int(r["client"]) == client]
        labels = [1 if r["label"] == "abnormal" else 0 for r in mine]
        if line["test_auc"] is None:  # single-class test split: no AUC on either side
            assert len(set(labels)) == 1
            continue
        auc = roc_auc_score(labels, [float(r["prob_abnormal"]) for r in mine])
        assert auc == line["test_auc"]
        checked += 1
    assert checked >= 2
