"""A round's record as the server assembles it: what the training brought back, then each hospital's evaluation.

The round loop (`federation.server.loop`) fills one ``RoundRecord`` per round and writes it as one line per
evaluated hospital in ``metrics.jsonl`` and one line in ``aggregation.jsonl`` once every hospital asked has answered
its evaluation. For a strategy that evaluates in the next round's message (``Strategy.evaluates_next_start``: the
averaging family) that is one round later, so the record waits in the round's checkpoint (``Checkpoint.pending``,
as JSON: floats round-trip exactly) and a resumed run writes the same lines an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from federation.errors import FederationError
from federation.runfiles import CONFIG_FILE, MetricsLine
from federation.runs import Checkpoint, finite_or_none, write_checkpoint
from federation.wire.contract import EvaluateReply, Strategy, TrainReply

DpMetric = Literal["dp_epsilon", "dp_delta", "dp_steps"]
DP_METRICS: tuple[DpMetric, ...] = get_args(DpMetric)  # what a DP hospital reports (federation.hospital.privacy)


@dataclass
class RoundRecord:
    """Round ``round``: values sent and received per hospital, what each trained hospital reported (``trained``:
    its scalar metrics and seconds), who was left out and why, the strategy's aggregation record, and the
    evaluations received so far. ``seconds``: the round's time up to its checkpoint; ``started``: when it began
    (``time.perf_counter``; ``None`` after a resume)."""

    round: int
    sent: dict[int, int] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)
    trained: dict[int, dict[str, Any]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    diverged: set[str] = field(default_factory=set)
    silent: set[int] = field(default_factory=set)
    aggregation: dict[str, Any] = field(default_factory=dict)
    evaluated: dict[int, EvaluateReply] = field(default_factory=dict)
    seconds: float = 0.0
    started: float | None = None

    def add_trained(self, hospital: int, reply: TrainReply) -> None:
        self.trained[hospital] = {"metrics": dict(reply.metrics), "seconds": reply.seconds}

    def leave_out(self, hospital: int, reason: str, *, diverged: bool = False, evaluation: bool = False) -> None:
        """Record why ``hospital`` is left out; an evaluation's reason is added to its training's, if any."""
        key = str(hospital)
        if evaluation:
            reason = (f"{self.left_out[key]}; " if key in self.left_out else "") + f"evaluation: {reason}"
        self.left_out[key] = reason
        if diverged:
            self.diverged.add(key)

    def to_evaluate(self, hospitals: Iterable[int]) -> list[int]:
        """The hospitals still to be asked for this round's evaluation: not evaluated yet, and not silent (a
        hospital that did not answer its training is probably down: it is not waited for again)."""
        return [c for c in hospitals if c not in self.evaluated and c not in self.silent]

    def left_out_lines(self) -> list[dict[str, Any]]:
        """Who the round did without, and why, as ``summary.json``'s ``left_out`` (the run's end names them:
        ``federation.server.summary``)."""
        return [
            {"hospital": int(who), "round": self.round, "reason": why, "evaluated": int(who) in self.evaluated}
            for who, why in sorted(self.left_out.items())
        ]

    def metrics_lines(self, hospitals: Iterable[int], counts: Mapping[int, int]) -> list[MetricsLine]:
        """``metrics.jsonl``'s lines (`federation.runfiles.MetricsLine`): one per evaluated hospital, in client
        order. A hospital whose training reply of this round was left out (or never came) has ``trained: false``,
        ``num_train: 0`` and no training figures: nothing of a reply the server did not use is recorded."""
        lines: list[MetricsLine] = []
        for c in hospitals:
            e = self.evaluated.get(c)
            if e is None:
                continue
            t = self.trained.get(c)
            metrics: dict[str, Any] = t["metrics"] if t else {}
            line: MetricsLine = {
                "round": self.round,
                "client": c,
                "train_loss": finite_or_none(metrics.get("train_loss")),
                "test_loss": finite_or_none(e.metrics.get("loss")),
                "test_acc": finite_or_none(e.metrics.get("acc")),
                "test_auc": finite_or_none(e.metrics.get("auc")),
                "fisher_trace": finite_or_none(metrics.get("fisher_trace")),
                "values_sent": self.sent.get(c, 0),
                "values_received": self.received.get(c, 0),
                "seconds": (t["seconds"] if t else 0.0) + e.seconds,
                # a count only its accepted training reply confirms: none of a left-out reply's numbers
                "num_train": counts[c] if t is not None else 0,
                "num_test": e.num_examples,
                "trained": t is not None,
            }
            # differential privacy (federation.hospital.privacy): the hospital's epsilon so far, its delta and the
            # DP-SGD
            # steps its ledger holds; only in runs with [privacy], so other runs' lines are unchanged
            for key in DP_METRICS:
                if key in metrics:
                    line[key] = finite_or_none(metrics[key])
            lines.append(line)
        return lines

    def aggregation_line(self, seconds: float) -> dict[str, Any]:
        """``aggregation.jsonl``'s line for the round."""
        return {
            "round": self.round,
            "seconds": seconds,
            "values_sent": sum(self.sent.values()),
            "values_received": sum(self.received.values()),
            **({"left_out": self.left_out} if self.left_out else {}),
            **self.aggregation,
        }

    # -- kept in the checkpoint while the evaluation is to come -------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "sent": {str(c): n for c, n in self.sent.items()},
            "received": {str(c): n for c, n in self.received.items()},
            "trained": {
                str(c): {"metrics": {k: finite_or_none(v) for k, v in t["metrics"].items()}, "seconds": t["seconds"]}
                for c, t in self.trained.items()
            },
            "left_out": dict(self.left_out),
            "diverged": sorted(self.diverged),
            "silent": sorted(self.silent),
            "aggregation": self.aggregation,
            "evaluated": {
                str(c): {"num_examples": e.num_examples, "metrics": e.metrics, "seconds": e.seconds}
                for c, e in self.evaluated.items()
            },
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoundRecord:
        """Inverse of ``to_json`` (a checkpoint's ``pending``)."""
        return cls(
            round=int(data["round"]),
            sent={int(c): int(n) for c, n in data["sent"].items()},
            received={int(c): int(n) for c, n in data["received"].items()},
            trained={
                int(c): {
                    "metrics": {k: float("nan") if v is None else v for k, v in t["metrics"].items()},
                    "seconds": float(t["seconds"]),
                }
                for c, t in data["trained"].items()
            },
            left_out={str(k): str(v) for k, v in data["left_out"].items()},
            diverged=set(map(str, data["diverged"])),
            silent=set(map(int, data["silent"])),
            aggregation=dict(data["aggregation"]),
            evaluated={
                int(c): EvaluateReply(int(c), int(e["num_examples"]), dict(e["metrics"]), float(e["seconds"]))
                for c, e in data["evaluated"].items()
            },
            seconds=float(data["seconds"]),
        )


def no_round(
    server_round: int, what: str, left_out: Mapping[str, str], diverged: set[str], lr: float, run_dir: Path
) -> FederationError:
    """The one line that stops a run when no hospital ``what`` in ``server_round``, with what to do: when every
    hospital left out diverged (its ``Failure`` says so), the advice is a lower learning rate than ``lr``
    (``client.lr``)."""
    reasons = "; ".join(f"hospital {c}: {r}" for c, r in left_out.items())
    if left_out and set(left_out) <= diverged:
        # a resumed run keeps client.lr, so --resume cannot fix a divergence: say what does
        return FederationError(
            f"round {server_round}: no hospital {what} ({reasons}); the training diverged "
            f"(client.lr is {lr}): start a new run with a lower client.lr, e.g. gastric-fl "
            f"train --config {run_dir / CONFIG_FILE} --set client.lr={lr / 100:g} "
            "--out NEW_RUN"
        )
    return FederationError(
        f"round {server_round}: no hospital {what} ({reasons}); "
        f"fix the cause, then continue with gastric-fl train --resume {run_dir}"
    )


def save_checkpoint(
    run_dir: Path, record: RoundRecord, hospitals: Sequence[int], strategy: Strategy, keep: int, pending: bool
) -> None:
    """The checkpoint after ``record``'s round: the hospitals, the strategy's state and, when the round's evaluation
    is still to come (``pending``), the round's record (``federation.runs.write_checkpoint`` keeps ``keep``)."""
    write_checkpoint(
        run_dir,
        Checkpoint(
            record.round,
            list(hospitals),
            strategy.state_tensors(),
            strategy.state_json(),
            record.to_json() if pending else None,
        ),
        keep=keep,
    )
