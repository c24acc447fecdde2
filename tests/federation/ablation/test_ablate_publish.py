"""`gastric-fl ablate --publish`: the tables plus the small raw files behind them, rebuildable without training."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
from support.checks import every
from support.paired_ablation import PairedFakeTrain, paired_ablation
from typer.testing import CliRunner

from federation.ablation import CELLS_ARCHIVE, PUBLISHED_RUN_FILES, load_plan, publish, run_plan, write_tables
from federation.errors import FederationError
from federation.provenance import (
    NOT_RECORDED,
    add_distinct,
    code_version,
    describe_code_versions,
    describe_machines,
)


def _trained(tmp_path: Path) -> tuple[Path, Path]:
    ablation = paired_ablation(tmp_path)
    out = tmp_path / "abl"
    run_plan(load_plan(ablation), out, train_fn=PairedFakeTrain(), progress=False, echo=lambda _: None)
    write_tables(load_plan(ablation), out, per_run_reports=False)
    # weights and predictions a real run leaves: never published
    (out / "cells" / "strategy-fedavg_seed-0" / "checkpoints").mkdir()
    (out / "cells" / "strategy-fedavg_seed-0" / "checkpoints" / "round_0001.safetensors").write_bytes(b"w")
    return ablation, out


def test_publish_copies_records_versions_and_command_and_rebuilds_the_same_tables(tmp_path: Path) -> None:
    from app.cli import app

    ablation, out = _trained(tmp_path)
    dest = tmp_path / "docs" / "results" / "p"
    files = publish(load_plan(ablation), out, dest, "gastric-fl ablate --config x.toml")
    # 11 finished runs (12 cells; separate seed 2 failed), each with its four record files, in one archive (no
    # loose cells/ folder); no checkpoint
    assert not (dest / "cells").exists()
    with tarfile.open(dest / CELLS_ARCHIVE, "r:xz") as tar:
        members = [m.name for m in tar.getmembers() if m.isfile()]
    runs = sorted({name.split("/")[1] for name in members})
    assert len(runs) == 11
    assert "strategy-separate_seed-2" not in runs
    for run in runs:
        assert sorted(n.split("/")[2] for n in members if n.split("/")[1] == run) == sorted(PUBLISHED_RUN_FILES)
    assert not [name for name in members if name.endswith(".safetensors")]
    assert every(path.is_file() for path in files)
    assert dest / CELLS_ARCHIVE in files
    versions = (dest / "versions.txt").read_text(encoding="utf-8").splitlines()
    assert versions[0].startswith("python 3.")
    assert any(line.startswith("torch==") for line in versions)
    command = (dest / "COMMAND.md").read_text(encoding="utf-8")
    assert "gastric-fl ablate --config x.toml" in command
    assert "--tables-only" in command
    assert f"are in `{CELLS_ARCHIVE}`" in command

    # the published copy alone rebuilds byte-identical tables (no training, no reports written into it)
    before = {p.name: p.read_bytes() for p in dest.glob("*.md") if p.name != "COMMAND.md"}
    before["paired.csv"] = (dest / "paired.csv").read_bytes()
    for name in before:
        (dest / name).unlink()
    result = CliRunner().invoke(app, ["ablate", "--config", str(ablation), "--out", str(dest), "--tables-only"])
    assert result.exit_code == 0, result.output
    assert {name: (dest / name).read_bytes() for name in before} == before
    assert not list(dest.rglob("report"))
    assert not (dest / "cells").exists()  # read from the archive, nothing unpacked into the published copy

    # publishing the same runs again packs the same bytes
    archive = (dest / CELLS_ARCHIVE).read_bytes()
    publish(load_plan(ablation), out, dest, "gastric-fl ablate --config x.toml")
    assert (dest / CELLS_ARCHIVE).read_bytes() == archive


def test_publish_replaces_only_its_own_folder(tmp_path: Path) -> None:
    ablation, out = _trained(tmp_path)
    dest = tmp_path / "pub"
    publish(load_plan(ablation), out, dest, "cmd 1")
    publish(load_plan(ablation), out, dest, "cmd 2")  # its own folder: replaced
    assert "cmd 2" in (dest / "COMMAND.md").read_text(encoding="utf-8")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pub.") and not p.name.endswith(".lock")]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep", encoding="utf-8")
    with pytest.raises(FederationError, match=r"--publish .*mine.* was not made by gastric-fl ablate --publish"):
        publish(load_plan(ablation), out, mine, "cmd")
    assert os.listdir(mine) == ["notes.txt"]
    with pytest.raises(FederationError, match="holds no ablation"):
        publish(load_plan(ablation), tmp_path / "nothing", tmp_path / "p2", "cmd")


def test_publish_names_the_commit_each_run_was_trained_at(tmp_path: Path) -> None:
    ablation, out = _trained(tmp_path)
    for run_id, versions in [("strategy-fedavg_seed-0", ["a" * 40]), ("strategy-fedavg_seed-1", ["a" * 40, "b" * 40])]:
        path = out / "cells" / run_id / "summary.json"
        summary = json.loads(path.read_text(encoding="utf-8"))
        machines = ["CPU X, 2 cores; device cpu"] if run_id.endswith("0") else ["CPU X, 2 cores; device cpu", "Y"]
        path.write_text(json.dumps({**summary, "code_versions": versions, "machines": machines}), encoding="utf-8")
    publish(load_plan(ablation), out, tmp_path / "pub", "cmd")
    command = (tmp_path / "pub" / "COMMAND.md").read_text(encoding="utf-8")
    assert "Runs were trained at different commits: " in command
    assert f"`{'a' * 40}`: 1 run(s) (strategy-fedavg_seed-0)" in command
    assert f"`{'a' * 40}` then `{'b' * 40}`: 1 run(s) (strategy-fedavg_seed-1)" in command
    assert "`not recorded`: 9 run(s)" in command  # the fake runs record none
    assert "Runs were trained on different machines: " in command
    assert "CPU X, 2 cores; device cpu: 1 run(s) (strategy-fedavg_seed-0)" in command
    assert "CPU X, 2 cores; device cpu then Y: 1 run(s) (strategy-fedavg_seed-1)" in command
    assert "a machine not recorded: 9 run(s)" in command


def test_code_versions_of_a_run_and_their_sentence() -> None:
    assert add_distinct(None, "abc") == ["abc"]
    assert add_distinct(["abc"], "abc") == ["abc"]  # a resume on the same code adds nothing
    assert add_distinct(["abc"], "def") == ["abc", "def"]
    assert describe_code_versions({}) == "No finished run."
    assert describe_code_versions({"`abc`": ["r1", "r2"]}) == "Every run was trained at `abc`."
    assert describe_code_versions({"`b`": ["r2"], "`a`": ["r1", "r3"]}) == (
        "Runs were trained at different commits: `a`: 2 run(s) (r1, r3); `b`: 1 run(s) (r2)."
    )
    assert describe_machines({"M, 2 cores": ["r1", "r2"]}) == "Every run was trained on M, 2 cores."
    assert describe_machines({NOT_RECORDED: ["r1"]}) == ""  # older runs: no sentence rather than a vague one


def test_the_published_command_is_the_one_that_trains_and_the_code_is_named() -> None:
    from app.cmd_ablate import training_arguments

    argv = ["ablate", "--config", "c.toml", "--out", "o", "--tables-only", "--publish", "docs/x", "--publish=d"]
    assert training_arguments(argv) == ["ablate", "--config", "c.toml", "--out", "o"]
    version = code_version()
    assert version == "unknown" or len(version.split()[0]) == 40


def test_the_rebuild_command_points_at_the_published_copy() -> None:
    from app.cmd_ablate import _with_out

    assert _with_out(["ablate", "--config", "m.toml", "--out", "data/x", "-q"], "docs/r") == [
        "ablate",
        "--config",
        "m.toml",
        "-q",
        "--out",
        "docs/r",
    ]
    assert _with_out(["ablate", "--config", "m.toml"], "docs/r")[-2:] == ["--out", "docs/r"]


def test_published_files_name_the_preset_relative_to_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ablation, out = _trained(tmp_path)
    elsewhere = tmp_path / "trained_from"  # the runs' own ablation.json names the preset where they were trained
    state = json.loads((out / "ablation.json").read_text(encoding="utf-8"))
    state["config"] = str(elsewhere / "configs" / "run.toml")
    (out / "ablation.json").write_text(json.dumps(state), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    plan = load_plan(ablation)
    write_tables(plan, out, per_run_reports=False)
    publish(plan, out, tmp_path / "pub", "gastric-fl ablate --config x.toml")

    shown = str(plan.config_path.resolve().relative_to(tmp_path.resolve()))
    assert not Path(shown).is_absolute()
    assert json.loads((tmp_path / "pub" / "ablation.json").read_text(encoding="utf-8"))["config"] == shown
    results = (tmp_path / "pub" / "results.md").read_text(encoding="utf-8")
    assert f"Base preset `{shown}`" in results
    assert str(tmp_path) not in results
