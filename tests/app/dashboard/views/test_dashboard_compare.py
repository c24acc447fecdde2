"""The Compare page's settings diff (exactly the keys that differ), its warnings when runs differ in rounds or
data, and an example `ablate` command that points at a dataset that exists."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from support.dashboard import Fixture, open_page, write_config, write_metrics, write_summary

from app.dashboard import commands, compare


def _run(root: Path, name: str, dataset: Path, *changes: tuple[str, str]) -> Path:
    """A finished run whose config.toml is the fixture's with some lines replaced (``(old, new)`` pairs)."""
    run = root / "runs" / name
    write_config(run, dataset)
    write_metrics(run)
    write_summary(run, "finished")
    text = (run / "config.toml").read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    (run / "config.toml").write_text(text)
    return run


def _summary(run: Path, **fields: object) -> None:
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, **fields}))


def test_settings_diff_lists_exactly_the_keys_that_differ(fixture_root: Fixture) -> None:
    a = fixture_root.finished
    b = _run(fixture_root.root, "b", fixture_root.dataset, ("lam = 1.0", "lam = 0.5"), ("seed = 0", "seed = 3"))
    c = _run(fixture_root.root, "c", fixture_root.dataset, ("seed = 0", "seed = 3"))
    (c / "config.toml").write_text((c / "config.toml").read_text() + "\n[fedprox]\nmu = 0.1\n")
    diff = compare.settings_diff([("a", a), ("b", b), ("c", c)])
    assert diff.problems == []
    assert diff.compared == ["a", "b", "c"]
    table = diff.table.set_index("setting")
    assert list(table.index) == ["amp.lam", "fedprox.mu", "run.seed"]
    assert table.loc["amp.lam"].tolist() == ["1.0", "0.5", "1.0"]
    assert table.loc["run.seed"].tolist() == ["0", "3", "3"]
    assert table.loc["fedprox.mu"].tolist() == ["—", "—", "0.1"]  # only c's config.toml has it
    assert compare.settings_diff([("a", a), ("a2", a)]).table.empty


def test_a_damaged_or_missing_config_is_left_out_of_the_diff_with_one_line(fixture_root: Fixture) -> None:
    broken = _run(fixture_root.root, "broken", fixture_root.dataset)
    (broken / "config.toml").write_text("[run\n")
    waiting = fixture_root.root / "runs" / "waiting"
    diff = compare.settings_diff([("a", fixture_root.finished), ("broken", broken), ("waiting", waiting)])
    assert diff.compared == ["a"]
    assert len(diff.problems) == 2
    assert diff.problems[0].startswith(f"{broken / 'config.toml'} is not valid TOML")
    assert "\n" not in diff.problems[0]
    assert "has not started" in diff.problems[1]


def test_runs_of_different_length_or_data_are_flagged(fixture_root: Fixture) -> None:
    a = fixture_root.finished
    assert compare.mismatches([("a", a), ("same", _run(fixture_root.root, "same", fixture_root.dataset))]) == []
    longer = _run(fixture_root.root, "longer", fixture_root.dataset, ("rounds = 2", "rounds = 4"))
    (rounds,) = compare.mismatches([("a", a), ("longer", longer)])
    assert "different numbers of rounds (a: 2, longer: 4)" in rounds
    other = fixture_root.root / "prepared" / "other"
    elsewhere = _run(fixture_root.root, "elsewhere", other)
    (data,) = compare.mismatches([("a", a), ("elsewhere", elsewhere)])
    assert "different datasets" in data
    assert str(other) in data
    # The same folder with another manifest.csv in between (dataset_sha256 in summary.json) is other data too.
    again = _run(fixture_root.root, "again", fixture_root.dataset)
    _summary(a, dataset_sha256="a" * 64)
    _summary(again, dataset_sha256="b" * 64)
    (changed,) = compare.mismatches([("a", a), ("again", again)])
    assert "sha256 of the dataset's manifest.csv differs" in changed
    _summary(again, dataset_sha256="a" * 64)
    assert compare.mismatches([("a", a), ("again", again)]) == []
    # Same plan, fewer rounds done: said too.
    _summary(again, rounds_done=1)
    (done,) = compare.mismatches([("a", a), ("again", again)])
    assert "completed different numbers of rounds (a: 2, again: 1)" in done


def test_the_example_ablate_command_points_at_a_dataset_that_exists(fixture_root: Fixture, tmp_path: Path) -> None:
    runs_dataset = [fixture_root.dataset]
    text = compare.example_ablate(fixture_root.root, [], runs_dataset)
    (line,) = text.splitlines()
    words = shlex.split(line)
    data = Path(words[words.index("--data") + 1])
    assert (data / "manifest.csv").is_file()
    assert words[:2] == ["gastric-fl", "ablate"]
    # A run whose dataset is gone: the first prepared dataset instead.
    assert str(fixture_root.dataset) in compare.example_ablate(fixture_root.root, [fixture_root.dataset], [tmp_path])
    # Nothing prepared yet: the commands that make the demo dataset come first, then the grid on it.
    empty = tmp_path / "empty"
    lines = compare.example_ablate(empty, [], [None]).splitlines()
    assert [shlex.split(line)[1] for line in lines] == ["synth", "prepare", "ablate"]
    prepared = shlex.split(lines[1])
    made = prepared[prepared.index("--out") + 1]
    ablate = shlex.split(lines[2])
    assert ablate[ablate.index("--data") + 1] == made == str(empty / "prepared" / commands.DEMO_NAME)


def test_the_compare_page_shows_the_diff_and_the_warning(fixture_root: Fixture) -> None:
    longer = _run(fixture_root.root, "z-longer", fixture_root.dataset, ("rounds = 2", "rounds = 4"))
    at = open_page("compare")
    at.multiselect(key="compare_runs").set_value([fixture_root.finished.name, longer.name])
    at.run()
    assert not at.exception
    warnings = [str(w.value) for w in at.warning]
    assert len(warnings) == 1
    assert "different numbers of rounds" in warnings[0]
    diff = next(d.value for d in at.dataframe if "setting" in d.value.columns)
    assert diff["setting"].tolist() == ["run.rounds"]
    assert diff[longer.name].tolist() == ["4"]
    assert at.dataframe[0].value["run"].tolist() == [fixture_root.finished.name, longer.name]  # tables first


def test_the_grid_view_with_no_grid_shows_a_runnable_command(fixture_root: Fixture) -> None:
    for path in sorted(fixture_root.grid.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    fixture_root.grid.rmdir()
    at = open_page("compare")
    at.segmented_control(key="compare_mode").set_value("Ablation grid")
    at.run()
    code = " ".join(str(c.value) for c in at.code)
    words = shlex.split(code)
    assert (Path(words[words.index("--data") + 1]) / "manifest.csv").is_file()


def test_a_relative_and_an_absolute_path_to_one_dataset_do_not_differ(fixture_root: Fixture) -> None:
    import os

    relative = os.path.relpath(fixture_root.dataset, Path.cwd())
    b = _run(fixture_root.root, "b", fixture_root.dataset, (f'path = "{fixture_root.dataset}"', f'path = "{relative}"'))
    assert f'path = "{relative}"' in (b / "config.toml").read_text()
    assert compare.settings_diff([("a", fixture_root.finished), ("b", b)]).table.empty
    other = fixture_root.root / "prepared" / "other"
    other.mkdir()
    c = _run(fixture_root.root, "c", fixture_root.dataset, (f'path = "{fixture_root.dataset}"', f'path = "{other}"'))
    table = compare.settings_diff([("a", fixture_root.finished), ("c", c)]).table.set_index("setting")
    assert table.loc["data.path"].tolist() == [str(fixture_root.dataset), str(other)]


def test_a_complete_run_with_a_damaged_line_is_damaged_not_failed(fixture_root: Fixture) -> None:
    b = _run(fixture_root.root, "b", fixture_root.dataset)
    with (b / "metrics.jsonl").open("a") as handle:
        handle.write('{"round": 2, "client": \n')
    table = compare.compare_table([("a", fixture_root.finished), ("b", b)]).set_index("run")
    assert table.loc["b", "status"] == "damaged"
    assert table.loc["a", "status"] == "finished"
    assert table.loc["a", "dm"] == "manhattan"
    text = table.astype(str).to_numpy().ravel().tolist()
    assert "None" not in text
