"""Malicious hospitals against the server (docs/design.md, "Trust model": the server believes nothing blindly).

One hospital's replies are edited on their way to the server (after its honest ``Hospital.answer``), as a
hostile participant's own code would send them: inflated example counts, NaN, negative or missing Fisher traces,
out-of-range metrics, wrong shapes, extra keys, an unreadable header. Each run must finish, leave that hospital out
of the round with the reason in ``aggregation.jsonl``, and keep the edited values out of ``metrics.jsonl`` and
``summary.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from support.checks import every
from support.tiny_dataset import LAYOUT, TINY_SETTINGS

from federation.config import load_config
from federation.engine import Server, local_sites, resolve_config
from federation.engine.pools import InProcessPool
from federation.runfiles import AGGREGATION_FILE, METRICS_FILE, SUMMARY_FILE
from federation.server.pool import Pool
from federation.wire.codec import Envelope

Edit = Callable[[dict[str, Any], dict[str, torch.Tensor]], None]
HOSTILE = 2


class EditingPool(InProcessPool):
    """Hospitals in this process; one hospital's replies of one kind are edited before the server reads them."""

    def __init__(self, sites: Any, kinds: tuple[str, ...], edit: Edit) -> None:
        super().__init__(sites)
        self.kinds, self.edit, self.edited = kinds, edit, 0

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        out = super()._send(envelopes)
        if HOSTILE in out and out[HOSTILE][0].get("kind") in self.kinds:
            header, tensors = json.loads(json.dumps(out[HOSTILE][0])), dict(out[HOSTILE][1])
            if self.kinds == EVALUATIONS:  # the evaluation, wherever it travels (fused into the training reply)
                target = header["evaluation"] if header["kind"] == "train_reply" else header
                if target is None:
                    return out
                self.edit(target, tensors)
            else:
                self.edit(header, tensors)
            out[HOSTILE] = (header, tensors)
            self.edited += 1
        return out


EVALUATIONS = ("evaluate_reply", "train_reply")


def run_with(
    dataset: Path, tmp_path: Path, method: list[str], kinds: tuple[str, ...], edit: Edit
) -> tuple[Path, EditingPool]:
    config = resolve_config(load_config(None, [*TINY_SETTINGS, *method], data=dataset))
    run_dir = tmp_path / "run"
    sites = local_sites(config, run_dir)
    pools: list[EditingPool] = []

    def make_pool() -> Pool:
        pools.append(EditingPool(sites, kinds, edit))
        return pools[-1]

    Server(config, run_dir, progress=False).run(make_pool)
    return run_dir, pools[0]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def set_header(**values: Any) -> Edit:
    def edit(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        header.update(values)

    return edit


def set_metric(name: str, value: Any) -> Edit:
    def edit(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        header["metrics"][name] = value

    return edit


def first_tensor(change: Callable[[torch.Tensor], torch.Tensor]) -> Edit:
    def edit(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        key = next(k for k in tensors if k.endswith("weight"))
        tensors[key] = change(tensors[key])

    return edit


def extra_key(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    tensors["shared/classifier.3.weight"] = torch.zeros(2, 1024)


FEDAVG = ["strategy.name=fedavg", "strategy.nhead=0"]
FEDSAF = ["strategy.name=fedsaf", "strategy.nhead=6"]
TRAIN_CASES = [
    ("inflated count", FEDAVG, set_header(num_examples=10**9), "declared"),
    ("NaN Fisher trace", FEDSAF, set_metric("fisher_trace", None), "Fisher trace nan"),
    ("negative Fisher trace", FEDSAF, set_metric("fisher_trace", -3.0), "Fisher trace -3.0"),
    ("negative training loss", FEDAVG, set_metric("train_loss", -1.0), "training loss -1.0"),
    ("wrong shape", FEDSAF, first_tensor(lambda t: t.flatten()), "expected"),
    ("wrong dtype", FEDAVG, first_tensor(lambda t: t.double()), "float64"),
    ("extra key", FEDSAF, extra_key, "extra ['classifier.3.weight']"),
    ("unreadable header", FEDAVG, set_header(num_examples="many"), "cannot be read"),
    # a field outside the contract (REPLY_FIELDS) is refused, not carried into the server's records
    ("foreign header field", FEDAVG, set_header(patient="Jane Doe"), "fields outside the contract (patient)"),
]


@pytest.mark.parametrize(("case", "method", "edit", "words"), TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_a_bad_training_reply_is_left_out_and_never_reaches_the_records(
    dataset: Path, tmp_path: Path, case: str, method: list[str], edit: Edit, words: str
) -> None:
    run_dir, pool = run_with(dataset, tmp_path, method, ("train_reply",), edit)
    assert pool.edited == 2  # both rounds were edited
    aggregation = records(run_dir / AGGREGATION_FILE)
    assert [r["round"] for r in aggregation] == [1, 2]
    for record in aggregation:
        assert words in record["left_out"][str(HOSTILE)], record["left_out"]
        assert set(record["left_out"]) == {str(HOSTILE)}
    lines = records(run_dir / METRICS_FILE)
    hostile = [r for r in lines if r["client"] == HOSTILE]
    assert hostile
    assert not any(r["trained"] for r in hostile)
    # no count of a reply the server left out (not 1e9, nor the Hello's): its training counted for nothing
    assert {r["num_train"] for r in hostile} == {0}
    assert {r["num_train"] for r in lines if r["trained"]} == {sum(LAYOUT[c]["train"]) for c in (0, 1)}
    assert every(r["fisher_trace"] is None or r["fisher_trace"] > 0 for r in lines)
    if method is FEDAVG:
        # the aggregate is the two honest hospitals' average: their received counts are the whole traffic
        assert every(r["values_received"] == 0 for r in hostile)
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    assert summary["status"] == "finished"
    assert summary["rounds_done"] == 2


EVAL_CASES = [
    ("accuracy 7", set_metric("acc", 7.0), "accuracy 7.0"),
    ("AUC -1", set_metric("auc", -1.0), "AUC -1.0"),
    ("loss missing", set_metric("loss", None), "loss None"),
    ("test count", set_header(num_examples=999), "999 test examples"),
]


@pytest.mark.parametrize(("case", "edit", "words"), EVAL_CASES, ids=[c[0] for c in EVAL_CASES])
def test_out_of_range_metrics_are_never_recorded_or_averaged(
    dataset: Path, tmp_path: Path, case: str, edit: Edit, words: str
) -> None:
    run_dir, pool = run_with(dataset, tmp_path, FEDSAF, EVALUATIONS, edit)
    assert pool.edited >= 2
    aggregation = records(run_dir / AGGREGATION_FILE)
    assert [r["round"] for r in aggregation] == [1, 2]
    for record in aggregation:
        assert words in record["left_out"][str(HOSTILE)], record["left_out"]
    lines = records(run_dir / METRICS_FILE)
    assert lines
    assert not [r for r in lines if r["client"] == HOSTILE]
    for r in lines:
        assert 0.0 <= r["test_acc"] <= 1.0
        assert r["test_auc"] is None or 0.0 <= r["test_auc"] <= 1.0
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    assert 0.0 <= summary["final"]["avg_test_acc"] <= 1.0
