"""Paired differences of `gastric-fl ablate`: each method minus Separate / FedAvg over the same seeds."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from support.paired_ablation import PairedFakeTrain, paired_ablation
from typer.testing import CliRunner

from federation.ablation import (
    T_975,
    load_plan,
    paired_differences,
    paired_interval,
    run_plan,
    t_quantile_975,
    write_tables,
)


def test_paired_interval_on_unequal_differences() -> None:
    # d = [0.1, 0.3, -0.05]: mean = 0.35 / 3 = 0.1166667
    # deviations -0.0166667, 0.1833333, -0.1666667 -> squares 0.0002778 + 0.0336111 + 0.0277778 = 0.0616667
    # sd = sqrt(0.0616667 / 2) = 0.1755942; t_{0.975, 2} = 4.302653
    # half-width = 4.302653 * 0.1755942 / sqrt(3) = 0.4362002 -> [-0.3195336, 0.5528669]
    stats = paired_interval([0.1, 0.3, -0.05])
    assert stats.n == 3
    assert stats.mean == pytest.approx(0.1166667, abs=1e-7)
    assert stats.sd == pytest.approx(0.1755942, abs=1e-7)
    assert stats.low == pytest.approx(-0.3195336, abs=1e-7)
    assert stats.high == pytest.approx(0.5528669, abs=1e-7)
    # two seeds: d = [0.1, 0.3]: mean 0.2, sd 0.1414214, half-width 12.706205 * 0.1414214 / sqrt(2) = 1.2706205
    two = paired_interval([0.1, 0.3])
    assert (two.low, two.high) == (pytest.approx(-1.0706205, abs=1e-7), pytest.approx(1.4706205, abs=1e-7))
    # one seed: a mean, no spread and no interval; none: nothing
    one = paired_interval([0.25])
    assert (one.n, one.mean, one.sd, one.low, one.high) == (1, 0.25, None, None, None)
    assert paired_interval([]).mean is None


def test_differences_use_only_seeds_both_sides_have() -> None:
    method = {0: 0.9, 1: 0.8, 2: 0.7, 3: None}
    reference = {0: 0.7, 2: 0.75, 3: 0.5, 4: 0.6}
    assert paired_differences(method, reference) == pytest.approx([0.2, -0.05])


def test_t_quantiles() -> None:
    assert t_quantile_975(1) == 12.706205
    assert t_quantile_975(2) == 4.302653
    assert t_quantile_975(30) == 2.042272
    assert 1.96 <= t_quantile_975(60) < 2.0003
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)
    stats = pytest.importorskip("scipy.stats")
    for df, value in enumerate(T_975, start=1):
        assert value == pytest.approx(float(stats.t.ppf(0.975, df)), abs=1e-6)


def _tables_with_blocks(tmp_path: Path, blocks: str) -> tuple[dict[str, Path], Path]:
    """``paired_ablation`` with its blocks replaced by ``blocks``, run with ``PairedFakeTrain``: the tables written and
    the ablation folder."""
    ablation = paired_ablation(tmp_path)
    ablation.write_text(ablation.read_text(encoding="utf-8").split("[[ablation.block]]")[0] + blocks, encoding="utf-8")
    plan = load_plan(ablation)
    out = tmp_path / "abl"
    run_plan(plan, out, train_fn=PairedFakeTrain(), progress=False, echo=lambda _: None)
    return write_tables(plan, out, per_run_reports=False), out


def test_ablate_writes_and_prints_the_paired_table(tmp_path: Path) -> None:
    from app.cli import app

    ablation = paired_ablation(tmp_path)
    out = tmp_path / "abl"
    state = run_plan(load_plan(ablation), out, train_fn=PairedFakeTrain(), progress=False, echo=lambda _: None)
    assert [c["id"] for c in state["cells"] if c["status"] == "failed"] == ["strategy-separate_seed-2"]
    paths = write_tables(load_plan(ablation), out, per_run_reports=False)
    text = paths["paired"].read_text(encoding="utf-8")
    # fedavg - separate, seeds 0 and 1: acc d = [0.1, 0.3] -> 0.2 +- 12.706205 * 0.1414214 / sqrt(2) = 1.2706205,
    # MDD (12.706205 + 1.376382) * 0.1414214 / sqrt(2) = 1.4082587;
    # AUC d = [0.1, 0.1] -> 0.1 with sd 0: [0.1, 0.1], MDD 0; worst hospital = the same figures (equal hospitals)
    assert (
        "| fedavg | separate | 2 | +0.2000 [-1.0706, +1.4706] (MDD 1.4083) | +0.1000 [+0.1000, +0.1000] (MDD 0.0000) |"
        in text
    )
    # fedamp - separate: acc d = [0.2, 0.2] -> [0.2, 0.2]; AUC d = 0.15
    assert (
        "| fedamp | separate | 2 | +0.2000 [+0.2000, +0.2000] (MDD 0.0000) | +0.1500 [+0.1500, +0.1500] (MDD 0.0000) |"
        in text
    )
    # fedamp - fedavg, seeds 0, 1, 2: acc d = [0.1, -0.1, -0.05]: mean -0.0166667,
    # sd = sqrt((0.1166667^2 + 0.0833333^2 + 0.0333333^2) / 2) = sqrt(0.0216667 / 2) = 0.1040833,
    # half = 4.302653 * 0.1040833 / sqrt(3) = 0.2585572 -> [-0.2752239, 0.2418906];
    # MDD (4.302653 + 1.060660) * 0.1040833 / sqrt(3) = 0.3222950; AUC d = 0.05
    assert (
        "| fedamp | fedavg | 3 | -0.0167 [-0.2752, +0.2419] (MDD 0.3223) | +0.0500 [+0.0500, +0.0500] (MDD 0.0000) |"
        in text
    )
    assert "| separate | fedavg | 2 | -0.2000 [-1.4706, +1.0706] (MDD 1.4083) |" in text
    assert "| Δ Averaged test acc [95% CI] (MDD) |" in text
    assert "MDD: the minimum detectable difference" in text
    assert "fedsaf" not in text
    with (out / "paired.csv").open(encoding="utf-8") as handle:
        rows = {(r["method"], r["reference"]): r for r in csv.DictReader(handle)}
    assert set(rows) == {("fedavg", "separate"), ("fedamp", "separate"), ("separate", "fedavg"), ("fedamp", "fedavg")}
    row = rows[("fedamp", "fedavg")]
    assert row["n"] == "3"
    assert float(row["avg_test_acc_diff_mean"]) == pytest.approx(-0.0166667, abs=1e-7)
    assert float(row["avg_test_acc_diff_sd"]) == pytest.approx(0.1040833, abs=1e-7)
    assert float(row["avg_test_acc_diff_low"]) == pytest.approx(-0.2752239, abs=1e-7)
    assert float(row["avg_test_acc_diff_high"]) == pytest.approx(0.2418906, abs=1e-7)
    assert float(row["avg_test_acc_diff_mdd"]) == pytest.approx(0.3222950, abs=1e-7)
    assert float(rows[("fedavg", "separate")]["avg_test_acc_diff_mdd"]) == pytest.approx(1.4082587, abs=1e-7)
    assert float(row["avg_test_auc_diff_mdd"]) == 0.0  # equal differences: any true difference is found
    assert float(row["avg_test_auc_diff_mean"]) == pytest.approx(0.05)
    assert "Paired differences to Separate and FedAvg" in paths["results"].read_text(encoding="utf-8")

    # printed by the command, with the detectable difference of each compared pair
    result = CliRunner().invoke(app, ["ablate", "--config", str(ablation), "--out", str(out), "--tables-only"])
    assert result.exit_code == 0, result.output
    assert "| fedamp | fedavg | 3 | -0.0167 [-0.2752, +0.2419] (MDD 0.3223) |" in result.output
    # one seed: a mean and "n/a" for the interval, no MDD
    result = CliRunner().invoke(
        app, ["ablate", "--config", str(ablation), "--seeds", "1", "--out", str(out), "--tables-only"]
    )
    assert result.exit_code == 0, result.output
    assert "| fedavg | separate | 1 | +0.1000 [n/a] | +0.1000 [n/a] |" in result.output
    with (out / "paired.csv").open(encoding="utf-8") as handle:
        assert {r["avg_test_acc_diff_mdd"] for r in csv.DictReader(handle)} == {""}
    assert "paired differences:" in result.output


def test_pairs_match_every_other_setting(tmp_path: Path) -> None:
    tables, _ = _tables_with_blocks(
        tmp_path,
        '[[ablation.block]]\nstrategy = ["fedavg", "fedamp"]\n"client.lr" = [0.01, 0.05]\n'
        '[[ablation.block]]\nstrategy = "fedsaf"\n"client.lr" = 0.1\n',
    )
    text = tables["paired"].read_text(encoding="utf-8")
    # one fedamp - fedavg row per learning rate, no row for fedsaf (no fedavg at lr 0.1)
    assert "| client.lr | method | minus | n |" in text
    assert "| 0.01 | fedamp | fedavg | 3 | -0.0167 [-0.2752, +0.2419] (MDD 0.3223) |" in text
    assert "| 0.05 | fedamp | fedavg | 3 | -0.0167 [-0.2752, +0.2419] (MDD 0.3223) |" in text
    assert "fedsaf" not in text
    assert text.count("| fedamp |") == 2


def test_a_method_variant_is_paired_with_the_references_under_its_own_label(tmp_path: Path) -> None:
    # A setting of the method's own section, and a single-strategy block that changes the optimiser (a method's
    # prescribed recipe), make variants: compared with Separate and FedAvg at the shared settings.
    tables, _ = _tables_with_blocks(
        tmp_path,
        '[[ablation.block]]\nstrategy = ["separate", "fedavg"]\n'
        '[[ablation.block]]\nstrategy = "fedamp"\n"fedamp.dm" = "manhattan"\n'
        '[[ablation.block]]\nstrategy = "fedsaf"\n"client.optimizer" = "adam"\n"client.lr" = 0.001\n',
    )
    text = tables["paired"].read_text(encoding="utf-8")
    # fedamp - fedavg over seeds 0-2: as in the first test; fedsaf - fedavg: d = [0.15, 0.05, 0.2]: mean 0.1333333,
    # sd = sqrt((0.0166667^2 + 0.0833333^2 + 0.0666667^2) / 2) = 0.0763763, half = 4.302653 * 0.0763763 / sqrt(3)
    # = 0.1897277 -> [-0.0563944, +0.3230610]; MDD (4.302653 + 1.060660) * 0.0763763 / sqrt(3) = 0.2364999
    assert "| fedamp (dm=manhattan) | fedavg | 3 | -0.0167 [-0.2752, +0.2419] (MDD 0.3223) |" in text
    assert (
        "| fedsaf (client.optimizer=adam, client.lr=0.001) | fedavg | 3 | +0.1333 [-0.0564, +0.3231] (MDD 0.2365) |"
        in text
    )
    assert "| fedamp (dm=manhattan) | separate | 2 |" in text


def test_no_reference_no_paired_table(tmp_path: Path) -> None:
    tables, out = _tables_with_blocks(tmp_path, '[[ablation.block]]\nstrategy = ["fedamp", "fedsaf"]\n')
    assert "paired" not in tables
    assert not (out / "paired.md").exists()


def test_the_paired_references_are_the_methods_whose_spec_says_so() -> None:
    """A strategy fact on its spec (`StrategySpec.paired_reference`), not a list of names in the ablation code:
    local training alone and FedAvg, in the registry's order (the published tables' order)."""
    from federation.ablation import PAIRED_REFERENCES
    from federation.methods import SPECS

    assert PAIRED_REFERENCES == ("separate", "fedavg")
    assert [s.name for s in SPECS if s.paired_reference] == list(PAIRED_REFERENCES)
