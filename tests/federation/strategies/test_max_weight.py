"""``server.max_weight``: the cap on any one hospital's aggregation weight, here its example-count weight ``n_i / n``
(FedAvg family; the other methods' weights: ``test_bounded_weights.py``).

The pure water-filling cap (``federation.strategies.aggregation.cap_weights``) with hand-checkable numbers on unequal
weights; the configuration's checks (a cap below ``1/m`` and a strategy that shares nothing are refused in one
line); the averaging strategies at the message level; and the in-process engine on the tiny dataset
with a hospital that declares 10^9 training tiles in its Hello (believed by the server: the cap bounds its weight).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from support.checks import every
from support.tiny_dataset import LAYOUT, TINY_SETTINGS

from federation.bounds import max_weight_problem
from federation.config import config_to_toml, load_config
from federation.engine import Server, local_sites, resolve_config
from federation.engine.pools import InProcessPool
from federation.errors import FederationError
from federation.runfiles import AGGREGATION_FILE, METRICS_FILE, SUMMARY_FILE
from federation.runs import read_checkpoint
from federation.server.pool import Pool
from federation.strategies import EXAMPLE_WEIGHTED, STRATEGY_NAMES, StrategyContext, build_strategy
from federation.strategies.aggregation import cap_weights, weighted_sum
from federation.wire.codec import Envelope
from federation.wire.contract import TrainReply


def _shares(counts: list[float]) -> list[float]:
    total = sum(counts)
    return [c / total for c in counts]


# -- the pure function ------------------------------------------------------------------------------------------------


def test_one_huge_count_is_capped_and_the_rest_shared_in_proportion() -> None:
    # w ~ [1, 1e-8, 3e-8]: the first is capped at 0.5, the others share 0.5 as 10 : 30.
    capped = cap_weights(_shares([1e9, 10, 30]), 0.5)
    assert capped.dtype == torch.float64
    assert capped.tolist() == pytest.approx([0.5, 0.125, 0.375], abs=1e-15)


def test_a_second_pass_caps_the_weight_the_first_pass_lifted_over_the_cap() -> None:
    # [0.6, 0.3, 0.06, 0.04], cap 0.35. Pass 1: 0.6 -> 0.35; the others share 0.65 over their 0.4, so 0.3 becomes
    # 0.4875 > 0.35. Pass 2: it is capped too; 0.06 and 0.04 share 1 - 0.7 = 0.3 as 3 : 2 -> 0.18 and 0.12.
    capped = cap_weights(_shares([60, 30, 6, 4]), 0.35)
    assert capped.tolist() == pytest.approx([0.35, 0.35, 0.18, 0.12], abs=1e-15)
    assert float(capped.sum()) == pytest.approx(1.0, abs=1e-15)


def test_a_cap_that_binds_nobody_changes_nothing_exactly() -> None:
    weights = [0.125, 0.25, 0.625]
    assert cap_weights(weights, 1.0).tolist() == weights
    assert cap_weights(weights, 0.625).tolist() == weights  # at the cap is not above it
    assert cap_weights(_shares([10, 7, 5]), 1.0).tolist() == _shares([10, 7, 5])


def test_a_cap_of_one_over_m_gives_uniform_weights() -> None:
    assert cap_weights(_shares([8, 1, 1]), 1 / 3).tolist() == pytest.approx([1 / 3] * 3, abs=1e-15)
    assert cap_weights(_shares([6, 1, 1, 0]), 0.25).tolist() == pytest.approx([0.25] * 4, abs=1e-15)


def test_uncapped_clients_of_weight_zero_share_the_excess_evenly() -> None:
    assert cap_weights([1.0, 0.0, 0.0], 0.5).tolist() == pytest.approx([0.5, 0.25, 0.25], abs=1e-15)


@pytest.mark.parametrize("seed", range(5))
def test_the_result_sums_to_one_and_never_exceeds_the_cap(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    counts = (torch.rand(7, generator=generator, dtype=torch.float64) ** 4 * 1000).tolist()
    for cap in (1 / 7, 0.15, 0.2, 0.3, 0.5, 0.9):
        capped = cap_weights(_shares(counts), cap)
        assert float(capped.sum()) == pytest.approx(1.0, abs=1e-12)
        assert float(capped.max()) <= cap + 1e-15
        # uncapped clients keep their ratios to one another
        free = [i for i, v in enumerate(capped.tolist()) if v < cap - 1e-12]
        for i in free:
            assert capped[i] / capped[free[0]] == pytest.approx(counts[i] / counts[free[0]], rel=1e-12)


def test_an_infeasible_cap_raises_one_line_naming_the_setting() -> None:
    words = r"server\.max_weight = 0\.3 .*use server\.max_weight >= 0\.333334"
    with pytest.raises(FederationError, match=words) as err:
        cap_weights(_shares([1, 2, 3]), 0.3)
    assert "\n" not in str(err.value)
    cap_weights(_shares([1, 2, 3]), 0.333334)  # the suggested value is accepted


def test_malformed_weights_are_a_value_error() -> None:
    for weights in ([], [0.5, 0.6], [1.5, -0.5], [float("nan"), 1.0]):
        with pytest.raises(ValueError, match="cap_weights needs"):
            cap_weights(weights, 0.9)


# -- the configuration ------------------------------------------------------------------------------------------------


def test_no_cap_by_default_and_the_config_text_is_what_it_was() -> None:
    config = load_config()
    assert config.server.max_weight is None
    assert "[server]" not in config_to_toml(config)  # a run without it writes (and sends in Hello) the old text


def test_a_cap_round_trips_through_the_run_config_text(tmp_path: Path) -> None:
    config = load_config(None, ["server.max_weight=0.5"])
    assert config.server.max_weight == 0.5
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(config), encoding="utf-8")
    assert load_config(path) == config


@pytest.mark.parametrize(("value", "words"), [(0, "(0, 1]"), (1.5, "(0, 1]"), (float("inf"), "(0, 1]")])
def test_a_cap_outside_zero_one_is_refused(value: float, words: str) -> None:
    with pytest.raises(FederationError, match=r"server\.max_weight") as err:
        load_config(None, [f"server.max_weight={value}"])
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_a_cap_below_one_over_the_listed_hospitals_is_refused_in_one_line() -> None:
    with pytest.raises(FederationError) as err:
        load_config(None, ["strategy.clients=[0, 1, 2]", "server.max_weight=0.3"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("config server.max_weight = 0.3 is out of range")
    assert "with 3 hospitals" in message
    assert "use server.max_weight >= 0.333334" in message
    assert load_config(None, ["strategy.clients=[0, 1, 2]", "server.max_weight=0.333334"]).server.max_weight
    assert load_config(None, ["strategy.clients=[0, 2]", "server.max_weight=0.5"]).server.max_weight == 0.5


def test_the_cap_applies_to_every_strategy_that_shares() -> None:
    assert {"fedavg", "fedprox", "fedrep", "fedbn"} == EXAMPLE_WEIGHTED
    sharing = [n for n in STRATEGY_NAMES if n != "separate"]
    assert len(sharing) == len(STRATEGY_NAMES) - 1
    for name in sharing:
        extra = ["client.optimizer=adam"] if name == "precision_weighted" else []
        assert load_config(None, [f"strategy.name={name}", *extra, "server.max_weight=0.5"]).server.max_weight == 0.5


def test_a_cap_for_a_strategy_that_shares_nothing_is_refused() -> None:
    with pytest.raises(FederationError) as err:
        load_config(None, ["strategy.name=separate", "server.max_weight=0.5"])
    message = str(err.value)
    assert "\n" not in message
    assert "server.max_weight = 0.5 does not apply to strategy separate: it shares nothing" in message
    assert "leave server.max_weight unset" in message


def test_max_weight_problem_is_the_one_rule_with_a_tolerance_at_one_over_m() -> None:
    assert max_weight_problem(3, 1 / 3) is None
    assert max_weight_problem(1, 1.0) is None
    assert max_weight_problem(4, 0.2499) is not None


# -- the averaging strategies -----------------------------------------------------------------------------------------

KEYS = ("a.weight", "b.weight")
UNITS = (("a", ["a.weight"]), ("b", ["b.weight"]))
INITIAL = {"a.weight": torch.zeros(2), "b.weight": torch.zeros(1)}
# Unequal clients: 1, 2 and 5 training tiles -> FedAvg weights 1/8, 2/8, 5/8.
CTX = StrategyContext((0, 1, 2), {0: 1, 1: 2, 2: 5}, KEYS, UNITS, INITIAL)
STATES = {
    0: {"a.weight": torch.tensor([1.0, 2.0]), "b.weight": torch.tensor([1.0])},
    1: {"a.weight": torch.tensor([3.0, 0.0]), "b.weight": torch.tensor([2.0])},
    2: {"a.weight": torch.tensor([0.0, 8.0]), "b.weight": torch.tensor([3.0])},
}


def _replies(clients: tuple[int, ...] = (0, 1, 2)) -> dict[int, TrainReply]:
    return {c: TrainReply(c, dict(STATES[c]), CTX.num_examples[c], {"train_loss": 0.5}) for c in clients}


def _aggregate(*overrides: str, clients: tuple[int, ...] = (0, 1, 2)) -> tuple[dict[str, Any], torch.Tensor]:
    strategy = build_strategy(load_config(None, ["strategy.nhead=0", *overrides]), CTX)
    record = strategy.aggregate_train(1, _replies(clients))
    return record, strategy.state_tensors()["a.weight"]


def test_fedavg_uses_and_records_the_capped_weights() -> None:
    # 5/8 > 0.5: capped; 1/8 and 2/8 share 0.5 as 1 : 2 -> 1/6 and 1/3.
    record, merged = _aggregate("strategy.name=fedavg", "server.max_weight=0.5")
    assert record["weights"] == pytest.approx({"0": 1 / 6, "1": 1 / 3, "2": 0.5}, abs=1e-15)
    assert record["weight_cap"] == {"max_weight": 0.5, "capped": ["2"], "uniform": False}
    expected = torch.tensor([1 / 6 * 1 + 1 / 3 * 3 + 0.5 * 0, 1 / 6 * 2 + 1 / 3 * 0 + 0.5 * 8])
    assert torch.allclose(merged.double(), expected.double(), atol=1e-6)


def test_without_the_setting_fedavg_is_unchanged_bit_for_bit() -> None:
    record, merged = _aggregate("strategy.name=fedavg")
    assert record == {"weights": {"0": 0.125, "1": 0.25, "2": 0.625}}  # no weight_cap field
    stacked = torch.stack([STATES[c]["a.weight"] for c in (0, 1, 2)])
    assert torch.equal(merged, weighted_sum(stacked, [0.125, 0.25, 0.625]))
    loose, loose_merged = _aggregate("strategy.name=fedavg", "server.max_weight=1.0")
    assert loose["weights"] == record["weights"]
    assert loose["weight_cap"] == {"max_weight": 1.0, "capped": [], "uniform": False}
    assert torch.equal(loose_merged, merged)


@pytest.mark.parametrize("name", ["fedprox", "fedrep", "fedbn"])
def test_the_other_example_weighted_strategies_are_capped_the_same_way(name: str) -> None:
    overrides = [f"strategy.name={name}", "server.max_weight=0.5"]
    if name == "fedrep":
        overrides.append("strategy.nhead=1")
    strategy = build_strategy(load_config(None, overrides), CTX)
    keys = strategy.shared_keys(KEYS, [u for _, u in UNITS])
    replies = {c: TrainReply(c, {k: STATES[c][k] for k in keys}, CTX.num_examples[c], {}) for c in (0, 1, 2)}
    record = strategy.aggregate_train(1, replies)
    assert record["weights"] == pytest.approx({"0": 1 / 6, "1": 1 / 3, "2": 0.5}, abs=1e-15)


def test_a_cap_below_one_over_the_run_hospitals_is_refused_when_the_run_starts() -> None:
    with pytest.raises(FederationError, match=r"server\.max_weight = 0\.3 is out of range: with 3 hospitals"):
        build_strategy(load_config(None, ["strategy.name=fedavg", "strategy.nhead=0", "server.max_weight=0.3"]), CTX)


def test_a_round_with_too_few_hospitals_for_the_cap_falls_back_to_uniform_weights() -> None:
    # 0.4 >= 1/3 holds for the run's 3 hospitals; with hospital 2 left out, 2 remain and 0.4 < 1/2.
    record, merged = _aggregate("strategy.name=fedavg", "server.max_weight=0.4", clients=(0, 1))
    assert record["weights"] == {"0": 0.5, "1": 0.5}
    assert record["weight_cap"] == {"max_weight": 0.4, "capped": ["1"], "uniform": True}
    assert torch.equal(merged, torch.tensor([2.0, 1.0]))


# -- the engine, with a hospital that inflates the count it declares -------------------------------------------------

HOSTILE = 2
INFLATED = 10**9


class InflatingPool(InProcessPool):
    """Hospitals in this process; the hostile one reports ``INFLATED`` training tiles in every training reply and,
    unless ``honest_hello``, declares the same in its Hello (consistent, so the server's declared-count check
    believes it; with ``honest_hello`` the counts disagree and it is left out of every round)."""

    def __init__(self, sites: Any, honest_hello: bool) -> None:
        super().__init__(sites)
        self.honest_hello = honest_hello

    def _broadcast(self, envelope: Envelope) -> dict[int, Envelope]:
        return self._inflate(super()._broadcast(envelope))

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        return self._inflate(super()._send(envelopes))

    def _inflate(self, out: dict[int, Envelope]) -> dict[int, Envelope]:
        if HOSTILE in out:
            header, tensors = dict(out[HOSTILE][0]), out[HOSTILE][1]
            if header.get("kind") == "hello_reply" and not self.honest_hello:
                header["num_train"] = INFLATED
            elif header.get("kind") == "train_reply":
                header["num_examples"] = INFLATED
            out[HOSTILE] = (header, tensors)
        return out


def _run(dataset: Path, run_dir: Path, settings: list[str], inflate: str = "") -> list[dict[str, Any]]:
    """A 2-round FedAvg run; ``inflate``: "" all honest, "declared" the hostile hospital declares and reports
    ``INFLATED`` tiles, "reported" it only reports them. Returns the ``aggregation.jsonl`` records."""
    config = resolve_config(load_config(None, [*TINY_SETTINGS, "strategy.name=fedavg", *settings], data=dataset))
    sites = local_sites(config, run_dir)

    def make_pool() -> Pool:
        if not inflate:
            return InProcessPool(sites)
        return InflatingPool(sites, honest_hello=inflate == "reported")

    Server(config, run_dir, progress=False).run(make_pool)
    assert json.loads((run_dir / SUMMARY_FILE).read_text())["status"] == "finished"
    records = [json.loads(line) for line in (run_dir / AGGREGATION_FILE).read_text().splitlines() if line.strip()]
    assert [r["round"] for r in records] == [1, 2]
    return records


def _train(client: int) -> int:
    return sum(LAYOUT[client]["train"])


def test_an_inflated_hello_count_gets_at_most_the_cap(dataset: Path, tmp_path: Path) -> None:
    capped = _run(dataset, tmp_path / "capped", ["server.max_weight=0.5"], "declared")
    assert (_train(0), _train(1)) == (10, 7)  # the honest hospitals share the other half as 10 : 7
    for record in capped:
        assert "left_out" not in record  # the count matches the Hello: the server believes it
        assert record["weights"][str(HOSTILE)] <= 0.5
        assert record["weights"] == pytest.approx({"0": 0.5 * 10 / 17, "1": 0.5 * 7 / 17, "2": 0.5}, abs=1e-12)
        assert sum(record["weights"].values()) == pytest.approx(1.0, abs=1e-12)
        assert record["weight_cap"] == {"max_weight": 0.5, "capped": [str(HOSTILE)], "uniform": False}
    metrics = [json.loads(line) for line in (tmp_path / "capped" / METRICS_FILE).read_text().splitlines()]
    assert {r["num_train"] for r in metrics if r["client"] == HOSTILE} == {INFLATED}  # declared, and recorded so

    # without the cap the same hospital takes (almost) the whole average, and the record has its old fields
    uncapped = _run(dataset, tmp_path / "uncapped", [], "declared")
    for record in uncapped:
        assert "weight_cap" not in record
        assert record["weights"][str(HOSTILE)] == INFLATED / (INFLATED + 17)


def test_without_the_setting_an_honest_run_is_unchanged(dataset: Path, tmp_path: Path) -> None:
    plain = _run(dataset, tmp_path / "plain", [])
    total = sum(_train(c) for c in LAYOUT)
    for record in plain:
        assert "weight_cap" not in record
        assert record["weights"] == {str(c): _train(c) / total for c in LAYOUT}  # exactly n_i / n
    # a cap nobody reaches (10/22 < 0.5) gives the very same model, bit for bit
    loose = _run(dataset, tmp_path / "loose", ["server.max_weight=0.5"])
    assert [r["weights"] for r in loose] == [r["weights"] for r in plain]
    assert "[server]" not in (tmp_path / "plain" / "config.toml").read_text()
    for server_round in (1, 2):
        a = read_checkpoint(tmp_path / "plain", server_round).strategy_tensors
        b = read_checkpoint(tmp_path / "loose", server_round).strategy_tensors
        assert a.keys() == b.keys()
        assert every(torch.equal(a[k], b[k]) for k in a)


def test_a_round_left_with_too_few_hospitals_for_the_cap_uses_uniform_weights(dataset: Path, tmp_path: Path) -> None:
    # The hostile hospital reports another count than it declared: left out of every round, so 2 of the 3 reply
    # and a cap of 0.4 (>= 1/3) cannot hold for them (< 1/2): each gets 1/2, and the record says so.
    records = _run(dataset, tmp_path / "run", ["server.max_weight=0.4"], "reported")
    for record in records:
        assert "declared" in record["left_out"][str(HOSTILE)]
        assert record["weights"] == {"0": 0.5, "1": 0.5}
        assert record["weight_cap"] == {"max_weight": 0.4, "capped": ["0"], "uniform": True}
