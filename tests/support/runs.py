"""Reading a run's JSON-lines files in tests: every record, or every record without its wall times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VOLATILE = frozenset({"seconds"})  # wall time differs between runs; everything else must not


def records(run_dir: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """Every record of ``run_dir / name``, in file order."""
    return [json.loads(line) for line in (run_dir / name).read_text(encoding="utf-8").splitlines()]


def stable(run_dir: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """The records of ``run_dir / name`` without their wall times (``VOLATILE``): what two runs must share."""
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in records(run_dir, name)]


def metrics_line(round: int, client: int, test_acc: float, test_auc: float, train_loss: float = 0.5) -> dict[str, Any]:
    """A ``metrics.jsonl`` line (federation.runfiles.MetricsLine) with the given figures and fixed counts: for
    tests that fake a finished run without training."""
    return {
        "round": round,
        "client": client,
        "train_loss": train_loss,
        "test_loss": 0.4,
        "test_acc": test_acc,
        "test_auc": test_auc,
        "fisher_trace": None,
        "values_sent": 1000,
        "values_received": 900,
        "seconds": 1.0,
        "num_train": 10,
        "num_test": 4,
    }


def write_finished_run(run_dir: Path, config_toml: str, lines: list[dict[str, Any]]) -> dict[str, str]:
    """A finished run directory without training: ``config.toml``, ``lines`` as ``metrics.jsonl``, one
    ``aggregation.jsonl`` line of 2 s per round and ``summary.json`` saying finished; returns that summary."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(config_toml, encoding="utf-8")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    rounds = sorted({int(x["round"]) for x in lines})
    (run_dir / "aggregation.jsonl").write_text(
        "".join(json.dumps({"round": r, "seconds": 2.0}) + "\n" for r in rounds), encoding="utf-8"
    )
    summary = {"status": "finished"}
    (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return summary
