"""scripts/paired_difference.py: any two plain methods of a published folder, paired over common seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.scripts import ROOT, load_script


def _module() -> ModuleType:
    return load_script("paired_difference")


def _cell(params: dict[str, Any], seed: int, status: str = "finished") -> dict[str, Any]:
    name = "_".join(f"{k}-{v}" for k, v in params.items())
    return {
        "id": f"{name}_seed-{seed}",
        "params": params,
        "seed": seed,
        "status": status,
        "run_dir": f"cells/{name}_seed-{seed}",
    }


def test_pairs_plain_cells_by_seed_and_skips_variants_and_unfinished(tmp_path: Path) -> None:
    cells = [
        *(_cell({"strategy": "fedsaf"}, s) for s in range(5)),
        *(_cell({"strategy": "fedamp"}, s) for s in range(4)),  # seed 4 missing: left out
        _cell({"strategy": "fedamp"}, 4, status="partial"),
        _cell({"strategy": "fedsaf", "fim": "off"}, 0),  # a variant, not the plain method
    ]
    (tmp_path / "ablation.json").write_text(json.dumps({"cells": cells}), encoding="utf-8")
    acc: dict[str, list[float]] = {"fedsaf": [0.9, 0.8, 0.95, 0.7, 0.99], "fedamp": [0.85, 0.82, 0.9, 0.6]}
    auc: dict[str, list[float | None]] = {"fedsaf": [0.9, None, 0.9, 0.9, 0.9], "fedamp": [0.8, 0.8, 0.8, 0.8]}

    def figures(path: Path) -> dict[str, Any]:
        name, seed = path.name.rsplit("_seed-", 1)
        method = name.removeprefix("strategy-")
        assert method in acc, f"a variant's run was read: {path.name}"
        return {"avg_test_acc": acc[method][int(seed)], "avg_test_auc": auc[method][int(seed)]}

    stats = _module().pair(tmp_path, "fedsaf", "fedamp", figures)

    diffs = [0.9 - 0.85, 0.8 - 0.82, 0.95 - 0.9, 0.7 - 0.6]
    mean = sum(diffs) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3)
    half = 3.182446 * sd / 2  # t_{0.975, 3} as the ablation tables give it (6 digits)
    assert stats["avg_test_acc"].n == 4
    assert stats["avg_test_acc"].mean == pytest.approx(mean, abs=1e-12)
    assert stats["avg_test_acc"].low == pytest.approx(mean - half, abs=1e-12)
    assert stats["avg_test_acc"].high == pytest.approx(mean + half, abs=1e-12)
    assert stats["avg_test_auc"].n == 3  # seed 1 of fedsaf has no AUC
    assert stats["avg_test_auc"].mean == pytest.approx(0.1, abs=1e-12)


def test_cells_are_named_by_their_id_without_the_seed(tmp_path: Path) -> None:
    cells = [_cell({"strategy": "fedsaf", "nhead": 3}, s) for s in range(3)]
    cells += [_cell({"strategy": "fedsaf"}, s) for s in range(3)]
    (tmp_path / "ablation.json").write_text(json.dumps({"cells": cells}), encoding="utf-8")
    acc = {"strategy-fedsaf_nhead-3": [0.5, 0.75, 1.0], "strategy-fedsaf": [0.25, 0.5, 1.0]}

    def figures(path: Path) -> dict[str, Any]:
        name, seed = path.name.rsplit("_seed-", 1)
        return {"avg_test_acc": acc[name][int(seed)], "avg_test_auc": None}

    stats = _module().pair(tmp_path, "strategy-fedsaf_nhead-3", "fedsaf", figures)
    assert stats["avg_test_acc"].n == 3
    assert stats["avg_test_acc"].mean == pytest.approx(0.5 / 3, abs=1e-12)  # (0.25 + 0.25 + 0) / 3
    assert stats["avg_test_auc"].n == 0


def test_an_unknown_method_is_named(tmp_path: Path) -> None:
    (tmp_path / "ablation.json").write_text(json.dumps({"cells": [_cell({"strategy": "fedsaf"}, 0)]}), "utf-8")
    with pytest.raises(SystemExit, match="no finished run of 'fedamq'"):
        _module().pair(tmp_path, "fedsaf", "fedamq", lambda path: {})


def test_the_published_site_shift_folder_gives_fedsaf_against_fedamp_over_five_seeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = ROOT / "results" / "methods_site_shift"
    assert _module().main([str(folder), "fedsaf", "fedamp"]) == 0
    out = capsys.readouterr().out
    assert "methods_site_shift: fedsaf - fedamp, avg_test_acc:" in out
    assert "(n=5)" in out


def test_paired_text_words_a_difference() -> None:
    from federation.ablation import PairedStats, paired_text

    assert paired_text(PairedStats(3, 0.1, 0.02, 0.05, 0.15)) == "+0.100 [+0.050, +0.150] *"
    assert paired_text(PairedStats(3, -0.1, 0.2, -0.6, 0.4)) == "-0.100 [-0.600, +0.400]"
    assert paired_text(PairedStats(1, 0.25, None, None, None)) == "+0.250"
    assert paired_text(PairedStats(0, None, None, None, None)) is None


def test_the_minimum_detectable_difference_by_hand() -> None:
    from federation.ablation import PairedStats, minimum_detectable_difference, paired_interval, paired_text

    # d = [0.01, 0.03, -0.02, 0.05, 0.00]: mean 0.014, deviations -0.004, 0.016, -0.034, 0.036, -0.014 ->
    # squares 0.000016 + 0.000256 + 0.001156 + 0.001296 + 0.000196 = 0.00292, sd = sqrt(0.00292 / 4) = 0.0270185;
    # MDD = (t_{0.975, 4} + t_{0.80, 4}) * sd / sqrt(5) = (2.776445 + 0.940965) * 0.0270185 / 2.2360680 = 0.0449176
    stats = paired_interval([0.01, 0.03, -0.02, 0.05, 0.00])
    assert stats.sd == pytest.approx(math.sqrt(0.00073), abs=1e-15)
    expected = (2.776445 + 0.940965) * math.sqrt(0.00073) / math.sqrt(5)
    assert stats.mdd == pytest.approx(expected, abs=1e-12)
    assert stats.mdd == pytest.approx(0.0449176, abs=1e-7)
    # the interval's half-width uses t_{0.975} alone: the MDD is wider by the power term
    assert stats.high is not None
    assert stats.mean is not None
    assert stats.high - stats.mean == pytest.approx(2.776445 * math.sqrt(0.00073) / math.sqrt(5), abs=1e-12)
    assert paired_text(stats) == "+0.014 [-0.020, +0.048] (MDD 0.045)"
    # a significant difference keeps its mark before the MDD
    assert paired_text(PairedStats(3, 0.1, 0.02, 0.05, 0.15, 0.061)) == "+0.100 [+0.050, +0.150] * (MDD 0.061)"
    # d = [0.2, -0.1]: sd = sqrt(0.045) = 0.2121320, MDD = (12.706205 + 1.376382) * 0.2121320 / sqrt(2) = 2.1123881
    assert paired_interval([0.2, -0.1]).mdd == pytest.approx(14.082587 * math.sqrt(0.045) / math.sqrt(2), abs=1e-12)
    assert minimum_detectable_difference(math.sqrt(0.045), 2) == pytest.approx(2.1123881, abs=1e-7)
    # one seed: no spread, no MDD; none: nothing
    assert paired_interval([0.25]).mdd is None
    assert paired_interval([]).mdd is None
    with pytest.raises(ValueError, match="2 or more pairs"):
        minimum_detectable_difference(0.1, 1)


def test_t_quantiles_of_80_percent_power() -> None:
    from federation.ablation import T_80, t_quantile_80

    assert t_quantile_80(1) == 1.376382  # tan(0.3 pi): the Cauchy quantile
    assert t_quantile_80(2) == 1.060660  # 0.6 / sqrt(0.32), closed form at df = 2
    assert t_quantile_80(4) == 0.940965
    assert t_quantile_80(30) == 0.853767
    assert len(T_80) == 30
    assert list(T_80) == sorted(T_80, reverse=True)  # falls towards the normal 0.8416
    assert 0.8416 <= t_quantile_80(60) < 0.853767
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_80(0)
    assert T_80[0] == pytest.approx(math.tan(0.3 * math.pi), abs=1e-6)
    assert T_80[1] == pytest.approx(0.6 / math.sqrt(0.32), abs=1e-6)
    stats = pytest.importorskip("scipy.stats")
    for df, value in enumerate(T_80, start=1):
        assert value == pytest.approx(float(stats.t.ppf(0.80, df)), abs=1e-6)
