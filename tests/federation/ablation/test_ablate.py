"""The ablation runner: grids, resumability (finished cells skipped, partial ones resumed) and the tables."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support.runs import metrics_line, write_finished_run
from typer.testing import CliRunner

from federation.ablation import ABLATION_FILE, Cell, load_plan, parse_grid, run_plan, write_tables
from federation.config import RunConfig, config_to_toml, parse_override
from federation.errors import FederationError

PRESET = '[run]\nname = "t"\nrounds = 2\n[data]\npath = "DATA"\n'


def _preset(tmp_path: Path, text: str = PRESET) -> Path:
    """A run preset whose data.path is a folder with a manifest.csv (the fake engine never reads it)."""
    data = tmp_path / "ds"
    data.mkdir(exist_ok=True)
    (data / "manifest.csv").write_text("client,split,label,path,channels\n", encoding="utf-8")
    path = tmp_path / "preset.toml"
    path.write_text(text.replace("DATA", data.as_posix()), encoding="utf-8")
    return path


def test_grid_names_and_values_are_parsed() -> None:
    grid = parse_grid(["nhead=0,3,6", "fim=on,off", "dm=cosine,manhattan", "client.lr=0.1,1e-2", "split=false"])
    assert grid == {
        "strategy.nhead": [0, 3, 6],
        "fedsaf.fim": [True, False],
        "amp.dm": ["cosine", "manhattan"],
        "client.lr": [0.1, 0.01],
        "fedsaf.split": [False],
    }
    with pytest.raises(FederationError, match="unknown grid setting 'heads'"):
        parse_grid(["heads=1,2"])
    with pytest.raises(FederationError, match="name=value1,value2"):
        parse_grid(["nhead"])
    with pytest.raises(FederationError, match="repeats a value"):
        parse_grid(["nhead=1,1"])


def test_a_cells_set_options_are_written_as_toml_values() -> None:
    # infra.toml.toml_value: a plain word stays bare, any other string is quoted, a list is a TOML list; each reads
    # back as the value it was
    cell = Cell(
        (
            ("amp.dm", "cosine"),
            ("model.name", "timm/resnet18.a1_in1k"),
            ("strategy.wrap", ["fedlws"]),
            ("fedsaf.fim", False),
        ),
        3,
        0,
    )
    assert cell.overrides() == [
        "amp.dm=cosine",
        'model.name="timm/resnet18.a1_in1k"',
        'strategy.wrap=["fedlws"]',
        "fedsaf.fim=false",
        "run.seed=3",
    ]
    assert [parse_override(o)[2] for o in cell.overrides()] == [v for _, v in cell.params] + [3]


def test_cells_are_the_product_times_seeds_and_bad_cells_fail_before_running(tmp_path: Path) -> None:
    preset = _preset(tmp_path)
    plan = load_plan(preset, ["strategy=fedsaf", "fim=on,off", "split=on,off"], seeds=2)
    cells = plan.cells()
    assert len(cells) == 1 * 2 * 2 * 2
    assert cells[0].id == "strategy-fedsaf_fim-on_split-on_seed-0"
    assert [c.seed for c in cells[:2]] == [0, 1]
    assert plan.blocks[0].resolved_table() == "components"
    assert plan.cell_config(cells[1]).fedsaf.fim is True
    assert plan.cell_config(cells[1]).run.seed == 1
    assert load_plan(preset, ["strategy=fedsaf", "dm=cosine,euclidean"]).blocks[0].resolved_table() == "distances"
    assert load_plan(preset, ["strategy=fedsaf", "nhead=0,3"]).blocks[0].resolved_table() == "nhead"
    assert load_plan(preset, ["strategy=fedavg,fedamp"]).blocks[0].resolved_table() == "methods"
    with pytest.raises(FederationError, match=r"grid cell strategy-fedbest_seed-0: .*strategy.name"):
        load_plan(preset, ["strategy=fedavg,fedbest"])
    with pytest.raises(FederationError, match="give the grid with --grid"):
        load_plan(preset)


def test_ablation_preset_blocks_and_dedupe(tmp_path: Path) -> None:
    _preset(tmp_path)
    ablation = tmp_path / "ablation_x.toml"
    ablation.write_text(
        '[ablation]\nconfig = "preset.toml"\nseeds = 2\n'
        '[[ablation.block]]\ntable = "nhead"\nstrategy = ["fedavg", "fedamp"]\nnhead = 0\n'
        '[[ablation.block]]\nstrategy = "fedsaf"\nnhead = [0, 3]\n'
        '[[ablation.block]]\nstrategy = "fedavg"\nnhead = 0\n',  # already in block 1: not run twice
        encoding="utf-8",
    )
    plan = load_plan(ablation)
    assert plan.block_seeds(plan.blocks[0]) == [0, 1]
    assert [b.resolved_table() for b in plan.blocks] == ["nhead", "nhead", "nhead"]
    ids = [c.id for c in plan.cells()]
    assert len(ids) == (2 + 2) * 2
    assert "strategy-fedavg_nhead-0_seed-1" in ids
    assert load_plan(ablation, seeds=1).block_seeds(plan.blocks[1]) == [0]


def test_blocks_with_their_own_seeds_and_identical_cells_share_one_run(tmp_path: Path) -> None:
    _preset(tmp_path, PRESET + '[strategy]\nname = "fedsaf"\n')
    ablation = tmp_path / "ablation_y.toml"
    ablation.write_text(
        '[ablation]\nconfig = "preset.toml"\nseeds = 2\n'
        '[[ablation.block]]\nstrategy = "fedsaf"\n'
        '[[ablation.block]]\nseeds = 1\nfim = ["on", "off"]\n',
        encoding="utf-8",
    )
    plan = load_plan(ablation)
    assert [c.id for c in plan.cells()] == [
        "strategy-fedsaf_seed-0",
        "strategy-fedsaf_seed-1",
        "fim-on_seed-0",
        "fim-off_seed-0",
    ]
    out = tmp_path / "abl"
    fake = FakeTrain()
    messages: list[str] = []
    state = run_plan(plan, out, train_fn=fake, progress=False, echo=messages.append)
    # fim=on is FedSAF's default: the same resolved configuration as strategy=fedsaf, so it is not trained again
    assert [name for name, _ in fake.calls] == ["strategy-fedsaf_seed-0", "strategy-fedsaf_seed-1", "fim-off_seed-0"]
    assert "4 cells (3 runs, 1 cells reuse an identical run)" in messages[0]
    cells = {c["id"]: c for c in state["cells"]}
    assert cells["fim-on_seed-0"]["same_as"] == "strategy-fedsaf_seed-0"
    assert cells["fim-on_seed-0"]["run_dir"] == "cells/strategy-fedsaf_seed-0"
    assert cells["fim-on_seed-0"]["status"] == "finished"
    paths = write_tables(plan, out, per_run_reports=False)
    assert "| on | 1 |" in paths["table4_components"].read_text(encoding="utf-8")


class FakeTrain:
    """Writes a finished run directory like the engine's, with figures chosen so the tables are checkable.

    Two hospitals, two rounds. Final round: hospital 0 accuracy 0.6 + 0.1 * seed, AUC 0.5 + 0.2 * seed;
    hospital 1 accuracy 0.8 + 0.1 * seed, AUC 0.9; 1000 values sent and 900 received per hospital and round.
    """

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.fail = fail

    def __call__(self, config: RunConfig, run_dir: Path, *, resume: bool, overwrite: bool, progress: bool) -> Any:
        self.calls.append((run_dir.name, resume))
        if self.fail and self.fail in run_dir.name:
            raise FederationError("client 1, round 1: the training loss became nan")
        seed = config.run.seed
        figures = [(0.6 + 0.1 * seed, 0.5 + 0.2 * seed), (0.8 + 0.1 * seed, 0.9)]
        lines = [
            metrics_line(r, c, acc if r == 2 else acc - 0.2, auc, train_loss=0.5 / r)
            for r in (1, 2)
            for c, (acc, auc) in enumerate(figures)
        ]
        return write_finished_run(run_dir, config_to_toml(config), lines)


def _state(out: Path) -> Mapping[str, Any]:
    data: Mapping[str, Any] = json.loads((out / ABLATION_FILE).read_text(encoding="utf-8"))
    return data


def test_finished_cells_are_skipped_partial_ones_resumed_and_failures_recorded(tmp_path: Path) -> None:
    plan = load_plan(_preset(tmp_path), ["strategy=fedavg,fedprox,fedrep"], seeds=1)
    out = tmp_path / "abl"
    # fedprox was interrupted earlier: a run directory whose summary is not "finished"
    partial = out / "cells" / "strategy-fedprox_seed-0"
    partial.mkdir(parents=True)
    (partial / "config.toml").write_text("", encoding="utf-8")
    (partial / "summary.json").write_text(json.dumps({"status": "stopped"}), encoding="utf-8")
    fake = FakeTrain(fail="fedrep")
    state = run_plan(plan, out, train_fn=fake, progress=False, echo=lambda _: None)
    assert fake.calls == [
        ("strategy-fedavg_seed-0", False),
        ("strategy-fedprox_seed-0", True),  # resumed, not restarted
        ("strategy-fedrep_seed-0", False),
    ]
    statuses = {c["id"]: c["status"] for c in state["cells"]}
    assert statuses == {
        "strategy-fedavg_seed-0": "finished",
        "strategy-fedprox_seed-0": "finished",
        "strategy-fedrep_seed-0": "failed",
    }
    recorded = {c["id"]: c for c in _state(out)["cells"]}
    assert "nan" in recorded["strategy-fedrep_seed-0"]["error"]
    assert recorded["strategy-fedavg_seed-0"]["params"] == {"strategy": "fedavg"}
    assert recorded["strategy-fedavg_seed-0"]["run_dir"] == "cells/strategy-fedavg_seed-0"
    # Second invocation: only the failed cell runs again.
    again = FakeTrain()
    run_plan(plan, out, train_fn=again, progress=False, echo=lambda _: None)
    assert again.calls == [("strategy-fedrep_seed-0", False)]
    # Third: nothing left to do.
    idle = FakeTrain()
    final = run_plan(plan, out, train_fn=idle, progress=False, echo=lambda _: None)
    assert idle.calls == []
    assert {c["id"]: c["status"] for c in final["cells"]} == dict.fromkeys(statuses, "finished")


def test_a_missing_dataset_stops_the_grid_before_any_cell_runs(tmp_path: Path) -> None:
    plan = load_plan(_preset(tmp_path, PRESET.replace('"DATA"', '"nowhere/benchmark"')), ["strategy=fedavg"])
    fake = FakeTrain()
    with pytest.raises(FederationError, match=r"dataset nowhere/benchmark has no manifest.csv: make it with"):
        run_plan(plan, tmp_path / "abl", train_fn=fake, progress=False, echo=lambda _: None)
    assert fake.calls == []


def test_another_base_configuration_is_refused_in_the_same_folder(tmp_path: Path) -> None:
    preset = _preset(tmp_path)
    out = tmp_path / "abl"
    run_plan(load_plan(preset, ["strategy=fedavg"]), out, train_fn=FakeTrain(), progress=False, echo=lambda _: None)
    changed = load_plan(preset, ["strategy=fedavg"], overrides=["client.lr=0.5"])
    with pytest.raises(FederationError, match="another base configuration"):
        run_plan(changed, out, train_fn=FakeTrain(), progress=False, echo=lambda _: None)


def test_cells_are_not_added_to_a_folder_trained_on_another_version_of_the_dataset(tmp_path: Path) -> None:
    from infra.formats import manifest_sha256

    preset = _preset(tmp_path)
    manifest = tmp_path / "ds" / "manifest.csv"
    out = tmp_path / "abl"
    run_plan(load_plan(preset, ["strategy=fedavg"]), out, train_fn=FakeTrain(), progress=False, echo=lambda _: None)
    summary = out / "cells" / "strategy-fedavg_seed-0" / "summary.json"
    recorded = {**json.loads(summary.read_text()), "dataset_sha256": manifest_sha256(manifest.parent)}
    summary.write_text(json.dumps(recorded))  # as the engine records it
    wider = load_plan(preset, ["strategy=fedavg,fedprox"])
    same = FakeTrain()
    run_plan(wider, out, train_fn=same, progress=False, echo=lambda _: None)  # same tiles: the new cell is added
    assert same.calls == [("strategy-fedprox_seed-0", False)]
    manifest.write_text(manifest.read_text() + "0,train,normal,x.png,3\n", encoding="utf-8")  # other tiles now
    widest = load_plan(preset, ["strategy=fedavg,fedprox,fedrep"])
    refused = FakeTrain()
    with pytest.raises(FederationError, match=r"cell strategy-fedavg_seed-0 was trained on .* manifest sha256"):
        run_plan(widest, out, train_fn=refused, progress=False, echo=lambda _: None)
    assert refused.calls == []


def test_tables_give_mean_and_std_over_seeds(tmp_path: Path) -> None:
    plan = load_plan(_preset(tmp_path), ["strategy=fedavg,fedamp"], seeds=2)
    out = tmp_path / "abl"
    run_plan(plan, out, train_fn=FakeTrain(), progress=False, echo=lambda _: None)
    paths = write_tables(plan, out, per_run_reports=False)
    with (out / "table7_methods.csv").open(encoding="utf-8") as handle:
        rows = {row["strategy"]: row for row in csv.DictReader(handle)}
    row = rows["fedavg"]
    assert row["seeds"] == "2"
    # averaged accuracy: seed 0 (0.6 + 0.8) / 2 = 0.7, seed 1 (0.7 + 0.9) / 2 = 0.8 -> mean 0.75,
    # sample std sqrt(((0.7 - 0.75)^2 + (0.8 - 0.75)^2) / 1) = sqrt(0.005) = 0.0707107
    assert float(row["avg_test_acc_mean"]) == pytest.approx(0.75)
    assert float(row["avg_test_acc_std"]) == pytest.approx(0.0707107, abs=1e-6)
    # best averaged accuracy over rounds = the final round's here (round 1 is 0.2 lower)
    assert float(row["best_avg_test_acc_mean"]) == pytest.approx(0.75)
    # worst hospital AUC: seed 0 min(0.5, 0.9) = 0.5, seed 1 min(0.7, 0.9) = 0.7 -> 0.6 +- sqrt(0.02) = 0.1414214
    assert float(row["worst_test_auc_mean"]) == pytest.approx(0.6)
    assert float(row["worst_test_auc_std"]) == pytest.approx(0.1414214, abs=1e-6)
    # std over hospitals of the final accuracy: |0.8 - 0.6| / 2 = 0.1 in both seeds -> 0.1 +- 0
    assert float(row["std_test_acc_mean"]) == pytest.approx(0.1)
    # values sent per round: 2 hospitals x 1000
    assert float(row["sent_per_round_mean"]) == pytest.approx(2000)
    text = paths["table7_methods"].read_text(encoding="utf-8")
    # best averaged accuracy, then final averaged accuracy
    assert "| fedavg | 2 | 0.7500 ± 0.0707 | 0.7500 ± 0.0707 |" in text
    assert (out / "table7_methods.png").stat().st_size > 0
    assert "Table 7 style" in paths["results"].read_text(encoding="utf-8")


def test_cli_runs_a_real_grid_and_skips_it_the_second_time(tmp_path: Path) -> None:
    from support.tiny_dataset import TINY_SETTINGS, make_dataset

    from app.cli import app

    dataset = make_dataset(tmp_path / "tiny")
    preset = _preset(tmp_path, f'[run]\nname = "tiny"\n[data]\npath = "{dataset.as_posix()}"\n')
    args = ["ablate", "--config", str(preset), "--grid", "strategy=fedavg,fedamp", "--seeds", "1", "--quiet"]
    args += ["--out", str(tmp_path / "abl"), "--set", "run.rounds=1"]
    args += [f"--set={s}" for s in TINY_SETTINGS if not s.startswith("run.rounds")]
    args += ["--set", "amp.alpha_k=0.4", "--set", "amp.sigma=1.0", "--set", "amp.scale=relative"]
    runner = CliRunner()
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "2 cells (2 runs), 0 already finished, 2 to run" in first.output
    state = _state(tmp_path / "abl")
    assert [c["status"] for c in state["cells"]] == ["finished", "finished"]
    xi_logged = (tmp_path / "abl" / "cells" / "strategy-fedamp_seed-0" / "aggregation.jsonl").read_text()
    assert '"xi"' in xi_logged
    assert (tmp_path / "abl" / "cells" / "strategy-fedamp_seed-0" / "report" / "report.md").is_file()
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "2 cells (2 runs), 2 already finished, 0 to run" in second.output
