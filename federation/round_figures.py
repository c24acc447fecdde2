"""A round's figures over its hospitals, the one computation every report of a run uses (FedSAF paper 001, Sec. 5
and Tables 4-7): the test accuracy and AUC *averaged* over clients and their *standard deviation* over clients
(population std, ``ddof = 0``), values transmitted in each direction, wall seconds; a round missing clients that
other rounds have is flagged (`RoundStats.missing`). A client whose test split has one class has no AUC: it is left
out of the AUC mean and std, never counted as 0.5.

`round_stats` groups ``metrics.jsonl`` records by round; `run_figures` gives a run's final, best and traffic
figures over its complete rounds. ``gastric-fl report`` and the ablation tables (`federation.report`), the run's
``summary.json`` (``federation.server.summary``), the HTML report and the dashboard (``app.run_records.per_round``)
read them from here. Standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RoundStats:
    """One round over all clients: means and population standard deviations, and traffic in each direction.

    The one place a round's figures are computed: ``gastric-fl report``, the HTML report, the run's summary and the
    dashboard (``app.run_records.per_round``) all read them from here. ``auc_hospitals``: hospitals whose AUC
    counts (a single-class test split has none); ``seconds``: the hospitals' wall seconds summed (None when no
    record has them)."""

    round: int
    hospitals: int
    avg_train_loss: float | None
    avg_test_loss: float | None
    avg_test_acc: float
    std_test_acc: float
    avg_test_auc: float | None
    std_test_auc: float | None
    values_sent: int
    values_received: int
    missing: tuple[int, ...] = ()  # clients present in other rounds but not in this one
    auc_hospitals: int = 0
    seconds: float | None = None

    @property
    def complete(self) -> bool:
        """Whether every client seen in the run reported in this round."""
        return not self.missing


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: Sequence[float]) -> float | None:
    return statistics.pstdev(values) if values else None


def round_stats(metrics: Sequence[Mapping[str, Any]]) -> list[RoundStats]:
    """Group ``metrics.jsonl`` records by round (ascending); ``missing`` names the clients a round lacks."""
    by_round: dict[int, list[Mapping[str, Any]]] = {}
    for record in metrics:
        by_round.setdefault(int(record["round"]), []).append(record)
    everyone = {int(record["client"]) for record in metrics if "client" in record}
    out: list[RoundStats] = []
    for r in sorted(by_round):
        rows = by_round[r]
        # The engine writes null for a metric that was not finite: it is left out of the mean, not a crash.
        acc = [float(x["test_acc"]) for x in rows if x.get("test_acc") is not None]
        auc = [float(x["test_auc"]) for x in rows if x.get("test_auc") is not None]
        train_loss = [float(x["train_loss"]) for x in rows if x.get("train_loss") is not None]
        test_loss = [float(x["test_loss"]) for x in rows if x.get("test_loss") is not None]
        seconds = [float(x["seconds"]) for x in rows if x.get("seconds") is not None]
        out.append(
            RoundStats(
                round=r,
                hospitals=len(rows),
                avg_train_loss=_mean(train_loss),
                avg_test_loss=_mean(test_loss),
                avg_test_acc=statistics.fmean(acc) if acc else math.nan,
                std_test_acc=statistics.pstdev(acc) if acc else math.nan,
                avg_test_auc=_mean(auc),
                std_test_auc=_std(auc),
                values_sent=sum(int(x.get("values_sent") or 0) for x in rows),
                values_received=sum(int(x.get("values_received") or 0) for x in rows),
                missing=tuple(sorted(everyone - {int(x["client"]) for x in rows if "client" in x})),
                auc_hospitals=len(auc),
                seconds=math.fsum(seconds) if seconds else None,
            )
        )
    return out


def run_figures(stats: Sequence[RoundStats]) -> dict[str, Any]:
    """``final`` (last round), ``best`` (round with the highest averaged accuracy) and mean traffic per round.

    Only complete rounds count: a round missing a hospital would average over the others as if it were whole.
    """
    stats = [s for s in stats if s.complete]
    if not stats:
        return {"final": None, "best": None, "values_per_round": None}
    last = stats[-1]
    best = max(stats, key=lambda s: (s.avg_test_acc, -s.round))
    return {
        "final": {
            "round": last.round,
            "avg_train_loss": last.avg_train_loss,
            "avg_test_acc": last.avg_test_acc,
            "std_test_acc": last.std_test_acc,
            "avg_test_auc": last.avg_test_auc,
            "std_test_auc": last.std_test_auc,
        },
        "best": {"round": best.round, "avg_test_acc": best.avg_test_acc, "avg_test_auc": best.avg_test_auc},
        "values_per_round": {
            "sent": statistics.fmean(s.values_sent for s in stats),
            "received": statistics.fmean(s.values_received for s in stats),
        },
    }
