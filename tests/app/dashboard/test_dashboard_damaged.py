"""No traceback reaches a page: damaged run files become one line naming the file and what to do, the damaged run
is marked in the pickers, the other runs still work, and an unexpected error is one line (traceback to stderr)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard import MAIN, Fixture, open_page, write_config, write_metrics, write_summary

from app import cmd_dashboard, run_predictions, run_records

DAMAGED_METRICS = "20250102-000000-fedavg"  # newer than the fixture's runs: the pickers' default
DAMAGED_CONFIG = "20250102-000100-fedsaf"


def _damage_metrics(run: Path, line: int = 3) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[line - 1] = '{"round": 1, "client": 2, "test_acc'  # a line cut in the middle, with lines after it
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def damaged_metrics(fixture_root: Fixture) -> Path:
    """The fixture data root plus the newest run, finished, whose metrics.jsonl line 3 is not JSON."""
    run = fixture_root.root / "runs" / DAMAGED_METRICS
    write_config(run, fixture_root.dataset, strategy="fedavg")
    write_metrics(run)
    write_summary(run, "finished")
    _damage_metrics(run)
    return run


@pytest.fixture
def damaged_config(fixture_root: Fixture) -> Path:
    """The fixture data root plus a finished run whose config.toml is not TOML."""
    run = fixture_root.root / "runs" / DAMAGED_CONFIG
    write_config(run, fixture_root.dataset)
    write_metrics(run)
    write_summary(run, "finished")
    (run / "config.toml").write_text('[run\nrounds = = 2\n[data]\npath = "x"\n', encoding="utf-8")
    return run


def _errors(at: AppTest) -> list[str]:
    return [str(e.value) for e in at.error]


# --- the loaders -------------------------------------------------------------------------------------------------


def test_run_problem_names_the_damaged_line_and_what_to_do(fixture_root: Fixture, damaged_metrics: Path) -> None:
    problem = run_records.run_problem(damaged_metrics, fixture_root.root)
    assert problem is not None
    assert problem.startswith(f"runs/{DAMAGED_METRICS}/metrics.jsonl line 3 is not valid JSON")
    assert f"gastric-fl train --resume {damaged_metrics}" in problem
    assert "delete the run folder" in problem
    assert "\n" not in problem
    # The pages read what can be read: the other five records.
    metrics = run_records.load_metrics(damaged_metrics)
    assert len(metrics) == 5
    assert not ((metrics["round"] == 1) & (metrics["client"] == 2)).any()
    assert run_records.run_problem(fixture_root.finished, fixture_root.root) is None


def test_a_cut_off_last_line_is_damage_only_once_the_run_has_stopped_writing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"round": 1, "client": 0}\n{"round": 1, "cli')
    write_summary(run, "running")
    assert run_records.run_problem(run) is None  # being appended
    write_summary(run, "finished")
    problem = run_records.run_problem(run)
    assert problem is not None
    assert "metrics.jsonl line 2 is cut off" in problem


def test_damaged_config_summary_and_aggregation_are_named(tmp_path: Path, fixture_root: Fixture) -> None:
    run = tmp_path / "runs" / "r"
    write_config(run, fixture_root.dataset)
    write_metrics(run)
    (run / "config.toml").write_text("[run\n")
    (run / "summary.json").write_text("{not json")
    lines = (run / "aggregation.jsonl").read_text().splitlines()
    (run / "aggregation.jsonl").write_text("[1, 2]\n" + "\n".join(lines) + "\n")
    problem = run_records.run_problem(run, tmp_path)
    assert problem is not None
    assert problem.startswith("runs/r/config.toml is not valid TOML")
    assert problem.endswith("(2 more damaged files).")
    assert run_records.read_run_config(run) == {}
    assert run_records.load_summary(run) == {}
    assert sorted(run_records.xi_matrices(run_records.load_aggregation(run))) == [1, 2]  # the damaged line left out
    info = run_records.run_info(run, root=tmp_path)
    assert info.damaged
    assert info.error == problem
    assert info.status == "running"  # what summary.json would say is unknown; the pages show it as failed


def test_a_damaged_predictions_file_leaves_the_other_hospitals(fixture_root: Fixture) -> None:
    path = fixture_root.finished / "hospitals" / "client_01" / "predictions.csv"
    path.write_text("client,path,label,prob_abnormal\n1,a.png,maybe,0.5\n")
    found = run_predictions.read_run_predictions(fixture_root.finished)
    assert sorted(found.frame["client"].unique()) == [0, 2]
    (problem,) = found.problems
    assert problem.startswith(f"{path}, line 2: label must be normal/abnormal or 0/1")
    path.write_text("client,path,label,prob_0,prob_1,round\n1,a.png,0,0.9,0.1,1\n")
    (problem,) = run_predictions.read_run_predictions(fixture_root.finished).problems
    assert "2-class model's predictions (0, 1)" in problem


# --- the pages ---------------------------------------------------------------------------------------------------


def test_federation_page_with_a_damaged_metrics_jsonl(fixture_root: Fixture, damaged_metrics: Path) -> None:
    at = open_page("federation")  # the damaged run is the newest, so the page opens on it
    errors = _errors(at)
    assert len(errors) == 1, errors
    assert f"runs/{DAMAGED_METRICS}/metrics.jsonl line 3" in errors[0]
    assert "Traceback" not in errors[0]
    picker = at.selectbox(key="run_picker")
    assert picker.value == DAMAGED_METRICS
    labels = list(picker.options)  # AppTest lists the labels shown
    assert labels[0].endswith("⚠ damaged")
    assert not [label for label in labels[1:] if "damaged" in label]
    # The rest of the page works, on what could be read: hospital 2's AUC of round 2 is there.
    shown = at.dataframe[0].value.set_index("hospital")["test AUC"].to_dict()
    assert shown["Hospital 2"] == 0.6875
    picker.set_value(fixture_root.finished.name)
    at.run()
    assert not at.exception
    assert not _errors(at)
    assert "finished" in " ".join(str(s.value) for s in at.success)


def test_compare_page_with_a_damaged_config_toml(fixture_root: Fixture, damaged_config: Path) -> None:
    at = open_page("compare")
    chosen = at.multiselect(key="compare_runs")
    assert DAMAGED_CONFIG in chosen.value  # finished runs are selected by default
    assert not _errors(at)  # a damaged run is called damaged, not failed
    damaged = [str(w.value) for w in at.warning if "is damaged" in str(w.value)]
    assert len(damaged) == 1, damaged
    assert f"Run **{DAMAGED_CONFIG}** is damaged:" in damaged[0]
    assert f"runs/{DAMAGED_CONFIG}/config.toml is not valid TOML" in damaged[0]
    table = at.dataframe[0].value.set_index("run")
    assert table.loc[fixture_root.finished.name, "Averaged ACC"] == pytest.approx(0.75)
    assert table.loc[DAMAGED_CONFIG, "status"] == "damaged"
    assert "None" not in table.astype(str).to_numpy().ravel().tolist()
    labels = {option.split(" · ")[0]: option for option in chosen.options}  # AppTest lists the shown labels
    assert labels[DAMAGED_CONFIG].endswith("⚠ damaged")
    assert not labels[fixture_root.failed.name].endswith("⚠ damaged")
    chosen.set_value([fixture_root.finished.name])
    at.run()
    assert not at.exception
    assert not _errors(at)


def test_hospital_page_with_one_damaged_predictions_csv(fixture_root: Fixture) -> None:
    path = fixture_root.finished / "hospitals" / "client_02" / "predictions.csv"
    path.write_text("client,path,label\n2,a.png,normal\n")
    at = open_page("hospital", {"selected_run": fixture_root.finished.name})
    errors = _errors(at)
    assert len(errors) == 1, errors
    assert str(path) in errors[0]
    table = next(d.value for d in at.dataframe if "sensitivity" in d.value.columns)
    assert table["hospital"].tolist() == ["Hospital 0", "Hospital 1"]


def test_hospital_page_with_an_unreadable_tile(fixture_root: Fixture) -> None:
    tile = fixture_root.dataset / "client_00" / "test" / "normal" / "s0teno1.png"
    tile.write_bytes(b"not a png")
    at = open_page("hospital", {"selected_run": fixture_root.finished.name})
    assert "cannot read s0teno1.png" in " ".join(str(c.value) for c in at.caption)
    images = [img for element in at.get("image") for img in element.proto.imgs]
    assert len(images) == 3  # the other three test tiles of hospital 0


# --- the guard ---------------------------------------------------------------------------------------------------


def _failing_page() -> None:
    import streamlit as st

    from app.dashboard import ui

    @ui.page_guard("Test")
    def body() -> None:
        st.title("Test")
        raise KeyError("no such column: prob_normal")

    body()
    st.caption("after the guard")


def test_page_guard_turns_an_exception_into_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    at = AppTest.from_function(_failing_page, default_timeout=30)
    at.run()
    assert not at.exception
    (error,) = _errors(at)
    assert error == "The Test page could not be drawn (KeyError: 'no such column: prob_normal')."
    assert "after the guard" in " ".join(str(c.value) for c in at.caption)
    stderr = capfd.readouterr().err
    assert "Traceback (most recent call last)" in stderr
    assert "the Test page stopped on an error" in stderr


def _stopping_page() -> None:
    import streamlit as st

    from app.dashboard import ui
    from app.errors import DashboardError

    with ui.page_guard("Test"):
        raise DashboardError("manifest.csv lacks columns ['split']")
    with ui.page_guard("Test"):
        st.caption("before stop")
        st.stop()
    st.caption("never drawn")


def test_page_guard_shows_dashboard_errors_as_they_are_and_lets_st_stop_through() -> None:
    at = AppTest.from_function(_stopping_page, default_timeout=30)
    at.run()
    assert not at.exception
    assert _errors(at) == ["manifest.csv lacks columns ['split']"]
    captions = [str(c.value) for c in at.caption]
    assert captions == ["before stop"]


def _failing_fragment_page() -> None:
    import streamlit as st

    from app.dashboard import ui

    def panel() -> None:
        st.caption("in the fragment")
        raise ValueError("queue.json vanished while it was read")

    ui.fragment("Test", panel)()  # no guard around it: the fragment carries its own, for its own reruns
    st.caption("after the fragment")


def test_a_fragment_made_by_the_pages_carries_its_own_guard(capfd: pytest.CaptureFixture[str]) -> None:
    at = AppTest.from_function(_failing_fragment_page, default_timeout=30)
    at.run()
    assert not at.exception
    assert _errors(at) == ["The Test page could not be drawn (ValueError: queue.json vanished while it was read)."]
    assert [str(c.value) for c in at.caption][::2] == ["in the fragment", "after the fragment"]  # hint between
    assert "Traceback (most recent call last)" in capfd.readouterr().err


def test_every_fragment_of_every_page_is_made_under_the_guard() -> None:
    """A fragment's rerun runs only the fragment, bypassing the page's guard: pages make them with ui.fragment."""
    views = Path(MAIN).parent / "views"
    pages = sorted(views.glob("*.py"))
    assert len(pages) == 6
    made = {page.name: page.read_text(encoding="utf-8").count("ui.fragment(") for page in pages}
    assert made == {"compare.py": 1, "data.py": 1, "federation.py": 3, "hospital.py": 0, "slide.py": 0, "verdict.py": 0}
    for page in (*pages, Path(MAIN)):
        assert "st.fragment" not in page.read_text(encoding="utf-8"), page.name


def test_an_error_outside_any_guard_of_a_page_is_one_line(
    fixture_root: Fixture, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The catch-all around ``navigation.run()``: the Federation page's top-level code (not inside any guarded
    function) meets an unexpected error; the page shows one line and a hint, no traceback, no exception."""
    from app.dashboard import jobs

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jobs, "ensure_runner", broken)
    at = open_page("federation")  # asserts that no exception reached the page
    assert _errors(at) == ["The Federation page could not be drawn (OSError: [Errno 28] No space left on device)."]
    assert "details are in the terminal" in " ".join(str(c.value) for c in at.caption)
    assert not at.get("exception")
    stderr = capfd.readouterr().err
    assert "the Federation page stopped on an error" in stderr
    assert "Traceback (most recent call last)" in stderr


def test_the_dashboard_command_hides_error_details_from_the_browser() -> None:
    command = cmd_dashboard.streamlit_command("127.0.0.1", 8501)
    assert command[command.index("--client.showErrorDetails") + 1] == "none"


def test_the_run_list_survives_a_damaged_summary(fixture_root: Fixture) -> None:
    (fixture_root.finished / "summary.json").write_text("[1,")
    listed = {r.run_id: r for r in run_records.list_runs(fixture_root.root / "runs")}
    info = listed[fixture_root.finished.name]
    assert info.problem is not None
    assert info.problem.startswith(f"runs/{fixture_root.finished.name}/summary.json is not valid JSON")
    assert listed[fixture_root.failed.name].problem is None
    assert listed[fixture_root.failed.name].status == "failed"


@pytest.mark.parametrize("page", ["data", "hospital"])
def test_every_tile_image_has_a_caption_and_alt_text(fixture_root: Fixture, page: str) -> None:
    at = open_page(page, {"selected_run": fixture_root.finished.name})
    images = [img for element in at.get("image") for img in element.proto.imgs]
    assert len(images) == (24 if page == "data" else 4)  # 8 per hospital (one tab each); hospital 0's test tiles
    for img in images:
        assert img.caption
        assert img.alt.startswith("Hospital ")
        assert ("labelled" in img.alt) if page == "data" else ("probability of" in img.alt)
