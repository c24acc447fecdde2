"""Every dashboard page through Streamlit's AppTest on the fixture data root: what the page shows is checked
against the files (metrics.jsonl, manifest.csv, predictions.csv), bad settings are refused, a run starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard import (
    Fixture,
    open_page,
    write_config,
    write_metrics,
    write_predictions,
    write_running,
    write_summary,
)

from app.dashboard import jobs, paths


def _metric(at: AppTest, label: str) -> str:
    return next(str(m.value) for m in at.metric if m.label == label)


def _texts(elements: object) -> str:
    return " ".join(str(e.value) for e in elements)  # type: ignore[attr-defined]


def test_data_page_shows_each_hospitals_counts(fixture_root: Fixture) -> None:
    at = open_page("data")
    assert _metric(at, "Hospitals") == "3"
    assert _metric(at, "Tiles") == "24"
    table = at.dataframe[0].value.set_index("hospital")
    assert table.loc["Hospital 1", ["train normal", "train abnormal", "test normal", "test abnormal"]].tolist() == [
        2,
        2,
        2,
        2,
    ]
    assert table["grayscale"].tolist() == [False, False, True]
    assert table["stored px"].tolist() == ["16", "16", "16"]


def test_data_page_shows_the_shortcut_probe_and_its_warning(fixture_root: Fixture) -> None:
    from pipeline.probe import probe_prepared

    at = open_page("data")
    assert "prepared before prepare measured shortcuts" in _texts(at.info)
    record_path = fixture_root.dataset / "prepare.json"
    before = record_path.read_text(encoding="utf-8")
    try:
        record = json.loads(before)
        # the fixture's normal tiles are bright (200) and its abnormal ones dark (90): a planted shortcut
        record["shortcut_probe"] = probe_prepared(fixture_root.dataset)
        record_path.write_text(json.dumps(record), encoding="utf-8")
        at = open_page("data")
        warnings = _texts(at.warning)
        assert "alone separates the classes" in warnings
        probe = next(d.value for d in at.dataframe if "statistic" in d.value.columns)
        assert probe["statistic"].tolist()[2] == "mean pixel value over all channels"
        assert probe.iloc[2]["test AUC (12 tiles)"] == 1.0
    finally:
        record_path.write_text(before, encoding="utf-8")


def test_federation_page_shows_the_aucs_of_metrics_jsonl(fixture_root: Fixture) -> None:
    at = open_page("federation", {"selected_run": fixture_root.finished.name})
    last = {}
    for line in (fixture_root.finished / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        last[f"Hospital {record['client']}"] = record["test_auc"]  # later rounds overwrite earlier ones
    (latest,) = [d.value for d in at.dataframe if "test AUC" in d.value.columns]
    shown = latest.set_index("hospital")["test AUC"].to_dict()
    assert shown == last
    assert _metric(at, "Averaged AUC") == f"{sum(last.values()) / 3:.3f}"
    assert _metric(at, "Round") == "2 / 2"
    assert _metric(at, "Took") != "—"  # a finished run says how long it took
    assert "finished" in _texts(at.success)


def test_federation_and_compare_speak_each_hospitals_verdict(fixture_root: Fixture) -> None:
    from app.evaluation.tables import verdict_word
    from app.evaluation.verdict import Floor
    from app.verdicts import judge_run

    floor = Floor(0.5, 1, 0.4)
    state = {"selected_run": fixture_root.finished.name, "floor_sensitivity": 0.5, "floor_min_slides": 1,
             "floor_specificity": 0.4}  # fmt: skip
    judged = judge_run(fixture_root.finished, floor).judgements
    assert len(judged) >= 2
    expected = [verdict_word(j.verdict.kind, floor) for j in judged]
    assert all(word.endswith(" at floor 0.50 (below 0.90)") for word in expected)  # a lowered floor, said
    for page in ("federation", "compare"):
        at = open_page(page, state)
        if page == "compare":
            at.multiselect(key="compare_runs").set_value([fixture_root.finished.name])
            at.run()
        (table,) = [d.value for d in at.dataframe if "verdict" in d.value.columns]
        assert table["verdict"].tolist() == expected
        assert table["sensitivity"].tolist() == pytest.approx([j.score.point.sensitivity for j in judged], nan_ok=True)
        assert table["threshold"].tolist() == [j.threshold for j in judged]
        assert f"judged against the floor ({floor.words}" in _texts(at.caption)


def test_federation_page_shows_a_failed_runs_error(fixture_root: Fixture) -> None:
    at = open_page("federation", {"selected_run": fixture_root.failed.name})
    assert "CUDA is not available" in _texts(at.error)


def test_starting_a_run_creates_its_run_directory_and_stop_ends_it(fixture_root: Fixture) -> None:
    at = open_page("federation")
    at.number_input(key="cfg:run.rounds").set_value(50)  # long enough that Stop always lands before the end
    at.button(key="start").click()
    at.run()
    folder = paths.jobs_root(fixture_root.root)
    started = jobs.list_jobs(folder, kind="train")
    assert len(started) == 1
    job = started[0]
    run_dir = Path(job.target)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run_dir / "summary.json").is_file():
            assert jobs.state(folder, job).active, f"gastric-fl train exited early:\n{jobs.log_tail(job, 20)}"
            time.sleep(0.2)
        assert run_dir.parent == fixture_root.root / "runs"
        assert "rounds = 50" in (run_dir / "config.toml").read_text()
        time.sleep(0.5)  # the engine turns SIGTERM into a clean stop right after writing summary.json
        at.run()  # the page now watches the new run, with a Stop button
        at.button(key="stop").click()
        at.run()
        deadline = time.monotonic() + 60
        while jobs.state(folder, job).active and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
        assert jobs.state(folder, job) == jobs.JobState("stopped", 130)  # gastric-fl train's "stopped" exit code
        at.run()
        assert "was stopped" in _texts(at.warning)
    finally:
        jobs.stop(folder, jobs.load(folder, job.job_id) or job)


def test_hospital_page_roc_and_threshold(fixture_root: Fixture) -> None:
    at = open_page("hospital", {"selected_run": fixture_root.finished.name})
    # Hospital 0's test tiles: normal 0.2, 0.7; abnormal 0.9, 0.4 -> 3 of 4 pairs ranked right.
    assert _metric(at, "AUC") == "0.750"
    assert _metric(at, "Accuracy") == "0.500"
    at.slider(key=f"explore_{fixture_root.finished.name}_0").set_value(0.3)
    at.run()
    # exploring 0.30 is said, with what it would do, and the figures stay at the threshold in use (0.5, no card)
    explored = _texts(at.info)
    assert "Exploring threshold 0.30, not saved." in explored
    assert "would find 2 of 2 abnormal tiles (sensitivity 1.000) and call 1 of 2 normal tiles abnormal" in explored
    assert _metric(at, "Accuracy") == "0.500"
    assert _metric(at, "Sensitivity") == "0.500"
    assert "0.875" in _texts(at.caption)  # last round's AUC from metrics.jsonl, for comparison


def test_compare_page_table_and_grid(fixture_root: Fixture) -> None:
    at = open_page("compare")
    at.multiselect(key="compare_runs").set_value([fixture_root.finished.name])
    at.run()
    assert at.dataframe[0].value.iloc[0]["Averaged ACC"] == pytest.approx(0.75)
    assert at.dataframe[1].value.iloc[0]["Values transmitted"] == 11400
    at.segmented_control(key="compare_mode").set_value("Ablation grid")
    at.run()
    table = at.dataframe[0].value.set_index("run")
    assert len(table) == 4
    assert table.loc["nhead-2_dm-manhattan_seed-0", "Best ACC"] == pytest.approx(0.75 * 0.7)
    assert at.get("plotly_chart")  # the nhead x dm heatmap (and the curves) are drawn
    assert not at.exception


@pytest.mark.parametrize("page", ["data", "federation", "hospital", "compare"])
def test_every_page_explains_the_next_step_with_no_data(empty_root: Path, page: str) -> None:
    at = open_page(page)
    shown = _texts(at.info) + _texts(at.code)
    assert "gastric-fl" in shown or "Generate demo data" in shown


def test_demo_button_generates_and_prepares_a_dataset(empty_root: Path) -> None:
    at = open_page("data")
    at.button(key="demo_button").click()
    at.run()
    folder = paths.jobs_root(empty_root)
    (job,) = jobs.list_jobs(folder, kind="demo")
    deadline = time.monotonic() + 120
    while jobs.state(folder, job).active and time.monotonic() < deadline:
        time.sleep(0.5)
    assert jobs.state(folder, job).status == "succeeded", jobs.log_tail(job, 20)
    at.run()
    assert not at.exception
    assert _metric(at, "Hospitals") == "3"
    table = at.dataframe[0].value
    assert table["grayscale"].tolist() == [False, False, True]  # --grayscale-clients 2
    assert (empty_root / "raw" / "demo").is_dir()  # the raw slides stay next to the prepared tiles


def test_a_running_run_shows_round_k_of_k_and_time_left(fixture_root: Fixture) -> None:
    run = write_running(fixture_root)
    at = open_page("federation", {"selected_run": run.name})
    progress = at.get("progress")[0].proto
    assert progress.text == "Round 2 of 5 · about 1 min 35 s left"
    assert progress.value == 40  # percent
    assert _metric(at, "Round") == "2 / 5"
    assert not at.error


def _run_shown(at: AppTest) -> str:
    """The run id the Hospital page's picker shows (its label is ``<run id> · <method>``)."""
    return str(at.selectbox(key="hospital_run").value).split(" · ")[0]


def _stopped_partial_run(fx: Fixture) -> Path:
    """A newer run, stopped after round 1 (started from the Federation page), with its hospitals' predictions."""
    run = fx.root / "runs" / "20250101-000300-fedsaf"
    write_config(run, fx.dataset)
    write_metrics(run)
    write_predictions(run, fx.dataset)
    write_summary(run, "stopped")
    return run


def test_the_hospital_page_defaults_to_a_finished_run_over_one_the_app_just_started(fixture_root: Fixture) -> None:
    stopped = _stopped_partial_run(fixture_root)
    finished = fixture_root.finished.name
    # the app chose the stopped run (it was started and stopped from the Federation page): the finished one leads
    at = open_page("hospital", {"selected_run": stopped.name, "selected_run:by_app": True})
    assert _run_shown(at) == finished
    assert str(at.selectbox(key="hospital_run").options[0]).startswith(f"{finished} ")
    # no choice at all: the newest finished run, not the newer stopped one
    assert _run_shown(open_page("hospital")) == finished
    # the user's own choice of the stopped run is kept
    assert _run_shown(open_page("hospital", {"selected_run": stopped.name})) == stopped.name


def test_a_run_that_ended_without_a_hospital_is_not_shown_as_a_clean_finish(fixture_root: Fixture) -> None:
    """Issue 48: `train` exits 3 and names the hospital; the Federation page says the same from summary.json."""
    path = fixture_root.finished / "summary.json"
    original = path.read_text()
    summary = json.loads(original)
    reason = "hospital 1: its checkpoint C cannot be read (cut short): delete it to continue from an earlier round"
    summary["left_out"] = [{"hospital": 1, "round": 2, "reason": reason}]
    try:
        path.write_text(json.dumps(summary))
        at = open_page("federation", {"selected_run": fixture_root.finished.name})
        shown = _texts(at.warning)
        assert f"Run **{fixture_root.finished.name}** finished without every hospital:" in shown
        assert (
            "hospital 1 was left out of round 2, the run's last: its checkpoint C cannot be read (cut short): delete "
            "it to continue from an earlier round; its exported model (model.json) is not of round 2" in shown
        )
        assert "finished." not in _texts(at.success)
    finally:
        path.write_text(original)
    at = open_page("federation", {"selected_run": fixture_root.finished.name})
    assert f"Run **{fixture_root.finished.name}** finished." in _texts(at.success)
