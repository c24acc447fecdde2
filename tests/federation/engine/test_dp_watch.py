"""The server's check that a DP hospital's epsilon and steps grow (federation.server.dp_watch), on hand-made figures:
a reset ledger (the same figures again), an edited one (fewer steps), the honest growth, and a resumed run whose
figures come back from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from federation.server.dp_watch import DpWatch


def test_the_same_figures_again_are_named_and_growing_ones_are_not() -> None:
    watch = DpWatch()
    assert watch.check(1, {0: {"dp_epsilon": 4.9055, "dp_steps": 3}, 1: {"dp_epsilon": 4.9055, "dp_steps": 3}}) == {}
    flags = watch.check(2, {0: {"dp_epsilon": 4.9055, "dp_steps": 3}, 1: {"dp_epsilon": 6.7012, "dp_steps": 6}})
    assert flags == {
        "0": "round 2: hospital 0's DP ledger did not grow (steps 3 after 3, epsilon 4.9055 after 4.9055): its privacy "
        "ledger was reset or edited, so the epsilon it reports understates its privacy loss"
    }


def test_fewer_steps_with_a_larger_epsilon_are_named_for_the_steps() -> None:
    watch = DpWatch()
    watch.check(1, {2: {"dp_epsilon": 2.0, "dp_steps": 10}})
    flags = watch.check(2, {2: {"dp_epsilon": 2.5, "dp_steps": 4}})
    assert flags["2"].startswith("round 2: hospital 2's DP ledger did not grow (steps 4 after 10): ")


def test_a_run_without_dp_figures_is_never_flagged() -> None:
    watch = DpWatch()
    assert watch.check(1, {0: {"train_loss": 0.5}}) == {}
    assert watch.check(2, {0: {"train_loss": 0.4}}) == {}


def test_a_resumed_run_compares_with_the_figures_in_metrics_jsonl(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    lines = [
        {"round": 1, "client": 0, "trained": True, "dp_epsilon": 4.9055, "dp_steps": 3},
        {"round": 1, "client": 1, "trained": False, "num_train": 0},  # left out: no figures of its own
        "not json",
    ]
    metrics.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    watch = DpWatch.from_metrics(metrics)
    assert watch.last == {0: (4.9055, 3.0)}
    flags = watch.check(2, {0: {"dp_epsilon": 4.9055, "dp_steps": 3}, 1: {"dp_epsilon": 4.9, "dp_steps": 3}})
    assert list(flags) == ["0"]  # hospital 1 has nothing before it to compare with
    assert DpWatch.from_metrics(tmp_path / "absent.jsonl").last == {}
