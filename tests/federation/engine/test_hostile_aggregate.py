"""One hospital against the aggregate, through the in-process engine on the tiny dataset (docs/design.md, "Trust
model"; docs/federation.md, "Bounding a hospital's weight" and "Robust aggregation").

Hospital 2's replies are edited on their way to the server, as its own code would send them: its update scaled by
1e30 (the aggregate overflows: it is named, left out, and the run finishes), every hospital's so (the run stops in
one line naming them), its update scaled by 50 (norm bounding clips it), a Fisher trace of 1e30 (gamma, with and
without ``server.max_weight``), a Hello declaring 10^9 tiles (never in ``metrics.jsonl`` or ``report.md``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from support.tiny_dataset import LAYOUT, TINY_SETTINGS

from federation.config import load_config
from federation.engine import Server, local_sites, resolve_config
from federation.engine.pools import InProcessPool
from federation.errors import FederationError
from federation.report import load_run, write_report
from federation.runfiles import AGGREGATION_FILE, METRICS_FILE, SUMMARY_FILE
from federation.server.guard import OVERFLOW_LIMIT
from federation.server.pool import Pool
from federation.wire.codec import Envelope

HOSTILE = 2
Edit = Callable[[int, dict[str, Any], dict[str, torch.Tensor]], None]
FEDAVG = ["strategy.name=fedavg", "strategy.nhead=0"]
FEDSAF = ["strategy.name=fedsaf", "strategy.nhead=6"]


class EditingPool(InProcessPool):
    """Hospitals in this process; the replies of the hospitals in ``who`` of kind ``kind`` are edited (``edit``)
    before the server reads them."""

    def __init__(self, sites: Any, kind: str, edit: Edit, who: frozenset[int]) -> None:
        super().__init__(sites)
        self.kind, self.edit, self.who, self.edited = kind, edit, who, 0

    def _broadcast(self, envelope: Envelope) -> dict[int, Envelope]:
        return self._edited(super()._broadcast(envelope))

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        return self._edited(super()._send(envelopes))

    def _edited(self, out: dict[int, Envelope]) -> dict[int, Envelope]:
        for c in sorted(self.who & set(out)):
            if out[c][0].get("kind") == self.kind:
                header, tensors = json.loads(json.dumps(out[c][0])), dict(out[c][1])
                self.edit(c, header, tensors)
                out[c] = (header, tensors)
                self.edited += 1
        return out


def scaled(factor: float) -> Edit:
    def edit(client: int, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        for key, value in tensors.items():
            if value.is_floating_point():
                tensors[key] = value * factor

    return edit


def run(
    dataset: Path,
    run_dir: Path,
    settings: list[str],
    kind: str,
    edit: Edit,
    who: frozenset[int] = frozenset({HOSTILE}),
) -> tuple[EditingPool, list[str]]:
    """A 2-round run on the tiny dataset with ``who``'s replies of ``kind`` edited; returns the pool and the
    server's warning lines."""
    config = resolve_config(load_config(None, [*TINY_SETTINGS, *settings], data=dataset))
    sites = local_sites(config, run_dir)
    pools: list[EditingPool] = []

    def make_pool() -> Pool:
        pools.append(EditingPool(sites, kind, edit, who))
        return pools[-1]

    server = Server(config, run_dir, progress=False)
    warnings: list[str] = []
    server.warn = warnings.append
    server.run(make_pool)
    return pools[0], warnings


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(client: int) -> int:
    return sum(LAYOUT[client]["train"])


@pytest.mark.parametrize("method", [FEDAVG, FEDSAF], ids=["fedavg", "fedsaf"])
def test_an_update_scaled_by_1e30_is_named_left_out_and_the_run_finishes(
    dataset: Path, tmp_path: Path, method: list[str]
) -> None:
    pool, _ = run(dataset, tmp_path / "run", method, "train_reply", scaled(1e30))
    assert pool.edited == 2
    summary = json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())
    assert (summary["status"], summary["rounds_done"]) == ("finished", 2)
    aggregation = records(tmp_path / "run" / AGGREGATION_FILE)
    assert [r["round"] for r in aggregation] == [1, 2]
    for record in aggregation:
        assert list(record["left_out"]) == [str(HOSTILE)]
        reason = record["left_out"][str(HOSTILE)]
        assert "\n" not in reason
        assert "makes the aggregate overflow" in reason
        assert f"beyond {OVERFLOW_LIMIT:.2g}" in reason
        assert reason.startswith("its update (largest value 1.")
        assert "e+30; the others' at most" in reason
        if method is FEDAVG:  # the aggregate is the two honest hospitals' FedAvg, exactly
            assert record["weights"] == {"0": train(0) / 17, "1": train(1) / 17}
        else:
            assert record["clients"] == [0, 1]
    lines = records(tmp_path / "run" / METRICS_FILE)
    hostile = [r for r in lines if r["client"] == HOSTILE]
    assert len(hostile) == 2  # still evaluated (what it deploys), never counted as trained
    for r in hostile:
        assert (r["trained"], r["num_train"], r["train_loss"], r["values_received"]) == (False, 0, None, 0)
    honest = [r for r in lines if r["client"] != HOSTILE]
    assert len(honest) == 4
    for r in honest:
        assert r["trained"]
        assert r["num_train"] == train(r["client"])
        assert r["test_loss"] is not None
        assert r["test_loss"] < 1e3  # the honest models were never touched by it


def test_when_every_update_overflows_the_run_stops_in_one_line_naming_them(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FederationError) as err:
        run(dataset, tmp_path / "run", FEDAVG, "train_reply", scaled(1e30), frozenset({0, 1, 2}))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("round 1: no hospital sent an update that could be aggregated (hospital ")
    for c in (0, 1, 2):
        assert f"hospital {c}: its update (largest value" in message
    # as after a divergence (an honest run with a huge learning rate looks the same): a lower client.lr, new run
    assert "the training diverged (client.lr is 0.01): start a new run with a lower client.lr" in message
    assert json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())["status"] == "failed"


def test_norm_bounding_clips_an_update_scaled_by_50_every_round(dataset: Path, tmp_path: Path) -> None:
    pool, _ = run(
        dataset,
        tmp_path / "run",
        [*FEDAVG, "server.robust=norm_bound", "server.max_weight=0.4"],
        "train_reply",
        scaled(50.0),
    )
    assert pool.edited == 2
    aggregation = records(tmp_path / "run" / AGGREGATION_FILE)
    assert [r["round"] for r in aggregation] == [1, 2]
    for record in aggregation:
        robust = record["robust"]
        assert robust["clipped"] == [str(HOSTILE)]
        norms = robust["norms"]
        # the median of three norms is an honest one, and the hostile norm is far above it
        assert robust["median_norm"] == sorted(norms.values())[1]
        assert norms[str(HOSTILE)] > 10 * robust["median_norm"]
        assert robust["bound"] == robust["median_norm"]  # norm_factor 1
        assert "left_out" not in record  # bounded, not refused: its update still counts, no more than an honest one


def _trace(value: float) -> Edit:
    def edit(client: int, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        header["metrics"]["fisher_trace"] = value

    return edit


def test_a_1e30_fisher_trace_gets_gamma_1_without_the_cap_and_max_weight_with_it(dataset: Path, tmp_path: Path) -> None:
    run(dataset, tmp_path / "plain", FEDSAF, "train_reply", _trace(1e30))
    plain = records(tmp_path / "plain" / AGGREGATION_FILE)
    assert len(plain) == 2
    for record in plain:
        assert "weight_cap" not in record
        traces = record["fisher_traces"]
        assert traces[HOSTILE] == 1e30
        gamma = record["gamma"]
        assert gamma[HOSTILE] == 1.0  # 1e30 / (1e30 + t0 + t1) rounds to 1 when t0 + t1 < 1e14
        assert gamma[:2] == pytest.approx([traces[0] / 1e30, traces[1] / 1e30], rel=1e-12)

    run(dataset, tmp_path / "capped", [*FEDSAF, "server.max_weight=0.5"], "train_reply", _trace(1e30))
    aggregation = records(tmp_path / "capped" / AGGREGATION_FILE)
    assert len(aggregation) == 2
    for record in aggregation:
        t0, t1 = record["fisher_traces"][:2]
        # capped at 0.5; hospitals 0 and 1 share the other half in proportion to their own traces
        assert record["gamma"] == pytest.approx([0.5 * t0 / (t0 + t1), 0.5 * t1 / (t0 + t1), 0.5], rel=1e-12)
        assert record["weight_cap"]["capped"][-1] == str(HOSTILE)
        assert max(record["weights"].values()) <= 0.5 + 1e-12  # nobody weighs more than the cap in p


def _hello_count(value: int) -> Edit:
    def edit(client: int, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        header["num_train"] = value

    return edit


def _everything_written(run_dir: Path, out: Path) -> str:
    write_report([load_run(run_dir)], out)
    return "\n".join(
        path.read_text(encoding="utf-8") for path in (run_dir / METRICS_FILE, out / "report.md", out / "hospitals.csv")
    )


def test_a_hello_of_1e9_tiles_never_reaches_metrics_or_the_report(dataset: Path, tmp_path: Path) -> None:
    # Its training replies carry its true count, which is not what it declared: left out every round.
    run_dir = tmp_path / "run"
    pool, _ = run(dataset, run_dir, FEDAVG, "hello_reply", _hello_count(10**9))
    assert pool.edited == 1
    for record in records(run_dir / AGGREGATION_FILE):
        assert "its hello declared 1000000000" in record["left_out"][str(HOSTILE)]
    lines = records(run_dir / METRICS_FILE)
    hostile = [r for r in lines if r["client"] == HOSTILE]
    assert [r["num_train"] for r in hostile] == [0, 0]
    written = _everything_written(run_dir, tmp_path / "report")
    assert "| 2 | 0 |" in written  # the report's hospital row: num_train 0
    for number in ("1000000000", "1,000,000,000", "1e+09", "1e9"):
        assert number not in written


def test_a_hello_above_max_examples_leaves_that_hospital_out_of_the_run(dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _, warnings = run(dataset, run_dir, [*FEDAVG, "server.max_examples=1000"], "hello_reply", _hello_count(10**9))
    assert warnings == [
        "hospital 2 is left out of run run: its hello declares 1000000000 training tiles, more than "
        "server.max_examples = 1000; raise server.max_examples if that many is real"
    ]
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    assert (summary["status"], summary["clients"]) == ("finished", [0, 1])
    assert list(summary["left_out_at_hello"]) == ["2"]
    lines = records(run_dir / METRICS_FILE)
    assert sorted({r["client"] for r in lines}) == [0, 1]
    written = _everything_written(run_dir, tmp_path / "report")
    assert "1000000000" not in written
    for record in records(run_dir / AGGREGATION_FILE):
        assert record["weights"] == {"0": train(0) / 17, "1": train(1) / 17}


def test_a_hello_count_that_is_not_a_count_is_left_out_without_any_setting(dataset: Path, tmp_path: Path) -> None:
    _, warnings = run(dataset, tmp_path / "run", FEDAVG, "hello_reply", _hello_count(2**53 + 1))
    assert len(warnings) == 1
    assert "its hello declares 9007199254740993 training tiles, which is not a count" in warnings[0]
    assert json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())["clients"] == [0, 1]


# the tile as the unit: the tiny dataset's tile names do not say their slide (the server's check is the same)
DP = [
    "privacy.noise_multiplier=1.0",
    "privacy.max_grad_norm=1.0",
    "privacy.sample_rate=0.5",
    "privacy.unit=tile",
    "model.norm=group",
]


def _ledger_reset() -> Edit:
    """Every round after the first, the hospital reports its round-1 epsilon and steps again: what a ledger reset
    consistently in both its files (ledger and anchor) makes it send; its own checks cannot see it."""
    first: dict[int, tuple[float, float]] = {}

    def edit(client: int, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        metrics = header["metrics"]
        if client not in first:
            first[client] = (metrics["dp_epsilon"], metrics["dp_steps"])
        metrics["dp_epsilon"], metrics["dp_steps"] = first[client]

    return edit


def test_a_dp_ledger_reset_in_both_files_is_named_by_the_server(dataset: Path, tmp_path: Path) -> None:
    _, warnings = run(dataset, tmp_path / "run", [*FEDAVG, *DP], "train_reply", _ledger_reset())
    aggregation = records(tmp_path / "run" / AGGREGATION_FILE)
    assert "dp_not_growing" not in aggregation[0]
    flags = aggregation[1]["dp_not_growing"]
    assert list(flags) == [str(HOSTILE)]  # only the hostile hospital, not the honest two
    metrics = {(r["round"], r["client"]): r for r in records(tmp_path / "run" / METRICS_FILE)}
    epsilon, steps = metrics[(1, HOSTILE)]["dp_epsilon"], metrics[(1, HOSTILE)]["dp_steps"]
    assert metrics[(2, HOSTILE)]["dp_epsilon"] == epsilon  # what the server held for both rounds
    assert flags[str(HOSTILE)] == (
        f"round 2: hospital {HOSTILE}'s DP ledger did not grow (steps {steps:g} after {steps:g}, epsilon "
        f"{epsilon:.4f} after {epsilon:.4f}): its privacy ledger was reset or edited, so the epsilon it reports "
        "understates its privacy loss"
    )
    assert warnings == [flags[str(HOSTILE)]]
    # the honest hospitals' figures grew, and they are not named
    for c in (0, 1):
        assert metrics[(2, c)]["dp_epsilon"] > metrics[(1, c)]["dp_epsilon"]
