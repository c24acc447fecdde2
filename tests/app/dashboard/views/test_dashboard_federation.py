"""The Federation page's form through Streamlit's AppTest: plain settings first and the method's hyper-parameters
under "Advanced", one message per invalid field with Start disabled, Start disabled while a training runs, a
plain-sentence start banner, the step within a round on the progress bar, and a sentence sending a hospital whose
high AUC sits next to a low accuracy to the Hospital page's scorecard."""

from __future__ import annotations

import json
import sys
import time

import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard import Fixture, open_page, write_running

from app.dashboard import commands, jobs, paths
from federation.progress import RoundProgress, write_progress

SLEEP = [sys.executable, "-c", "import time; time.sleep(30)"]  # stands in for gastric-fl: it ignores the arguments


def _advanced(at: AppTest) -> object:
    return next(e for e in at.expander if str(e.label).startswith("Advanced"))


def _keys(block: object) -> set[str]:
    found = set()
    for kind in ("number_input", "selectbox", "toggle", "multiselect"):
        found |= {str(w.key) for w in getattr(block, kind)}
    return found


def _texts(elements: object) -> list[str]:
    return [str(e.value) for e in elements]  # type: ignore[attr-defined]


def test_plain_settings_first_and_the_methods_hyper_parameters_under_advanced(fixture_root: Fixture) -> None:
    at = open_page("federation")
    advanced = _keys(_advanced(at))
    assert {
        "cfg:fedsaf:strategy.nhead",
        "cfg:fedsaf:amp.dm",
        "cfg:fedsaf:amp.sigma",
        "cfg:fedsaf:amp.alpha_k",
    } <= advanced
    assert {"cfg:fedsaf:amp.lam", "cfg:fedsaf:fedsaf.fim", "cfg:fedsaf:fedsaf.split"} <= advanced
    assert {"cfg:strategy.bn", "cfg:client.start", "cfg:fedsaf.fisher_estimator"} <= advanced  # the shared settings
    plain = {"cfg:strategy.name", "cfg:run.rounds", "cfg:run.seed", "cfg:client.epochs", "cfg:client.lr"}
    assert not plain & advanced
    assert plain <= _keys(at)
    # The limits of federation.config: no negative rounds, seed or learning rate; nhead up to the model's units.
    assert at.number_input(key="cfg:run.rounds").min == 1
    assert at.number_input(key="cfg:client.lr").min == 0.0
    assert at.number_input(key="cfg:fedsaf:strategy.nhead").max == 15
    assert at.number_input(key="cfg:fedsaf:amp.sigma").min == 0.0
    # Another method brings its own hyper-parameters (and its own default nhead).
    at.selectbox(key="cfg:strategy.name").set_value("fedavg")
    at.run()
    advanced = _keys(_advanced(at))
    assert "cfg:fedavg:strategy.nhead" in advanced
    assert at.number_input(key="cfg:fedavg:strategy.nhead").value == 0
    assert not [k for k in advanced if "amp." in k or "fedsaf." in k or k == "cfg:client.start"]
    assert "cfg:strategy.wrap" in advanced  # FedAvg's result can be post-processed (FedLWS, FedTLU)
    at.selectbox(key="cfg:strategy.name").set_value("fedamp")
    at.run()
    assert "cfg:fedamp:fedamp.dm" in _keys(_advanced(at))
    assert "cfg:fedamp:strategy.nhead" not in _keys(_advanced(at))  # FedAMP shares everything


def test_each_invalid_field_has_its_own_message_and_start_is_disabled(fixture_root: Fixture) -> None:
    at = open_page("federation", {"selected_run": fixture_root.finished.name})
    assert not at.button(key="start").disabled
    at.number_input(key="cfg:client.lr").set_value(0.0)
    at.number_input(key="cfg:fedsaf:amp.alpha_k").set_value(0.6)  # 3 hospitals: at most sigma / 2 = 0.5
    at.run()
    errors = _texts(at.error)
    assert errors == [
        "Learning rate = 0: use a finite value > 0.",
        "alpha_k x (hospitals - 1) = 0.6 x 2 = 1.2 exceeds sigma = 1, so a hospital's weight on its own model could "
        "turn negative: lower alpha_k to at most 0.5 or raise sigma.",
    ]
    assert at.button(key="start").disabled
    at.number_input(key="cfg:client.lr").set_value(0.01)
    at.run()
    assert len(at.error) == 1  # the learning rate's message is gone, alpha_k's stays
    assert at.button(key="start").disabled
    at.number_input(key="cfg:fedsaf:amp.alpha_k").set_value(0.5)
    at.run()
    assert not at.error
    assert not at.button(key="start").disabled
    assert jobs.list_jobs(paths.jobs_root(fixture_root.root)) == []


def test_start_shows_a_plain_sentence_and_is_disabled_while_the_run_trains(
    fixture_root: Fixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "cli_prefix", lambda: list(SLEEP))
    folder = paths.jobs_root(fixture_root.root)
    at = open_page("federation")
    at.number_input(key="cfg:run.rounds").set_value(3)
    at.run()
    at.button(key="start").click()
    at.run()
    try:
        (job,) = jobs.list_jobs(folder, kind="train")
        assert jobs.state(folder, job).active
        assert job.title == "Training FedSAF on tiny, 3 rounds"
        assert job.commands[0][: len(SLEEP)] == SLEEP
        assert job.commands[0][len(SLEEP) :][:1] == ["train"]
        banner = _texts(at.info)
        assert "Training FedSAF on tiny, 3 rounds; follow it below." in " ".join(banner)
        shown = " ".join(_texts(at.info) + _texts(at.markdown) + _texts(at.error) + _texts(at.caption))
        assert "python -m" not in shown
        assert sys.executable not in shown
        # While it trains, Start is disabled and says why.
        assert at.button(key="start").disabled
        assert any("Training FedSAF on tiny, 3 rounds is still training" in text for text in banner)
        reloaded = open_page("federation")  # a reloaded page knows too (jobs.py's records)
        assert reloaded.button(key="start").disabled
        # ... and, while the run is still loading (no run folder yet), the reload keeps its banner and Stop
        assert "Training FedSAF on tiny, 3 rounds; follow it below." in " ".join(_texts(reloaded.info))
        reloaded.button(key="stop_pending").click()
        reloaded.run()
        deadline = time.monotonic() + 30
        while jobs.state(folder, job).active and time.monotonic() < deadline:
            time.sleep(0.2)
        assert jobs.state(folder, job).status == "stopped"
        reloaded.run()
        assert "Training FedSAF on tiny, 3 rounds was stopped before its first round." in _texts(reloaded.warning)
    finally:
        for record in jobs.list_jobs(folder):
            jobs.stop(folder, record)
    at.run()
    assert not at.button(key="start").disabled  # stopped: Start is back


def test_the_progress_bar_shows_the_step_within_the_round(fixture_root: Fixture) -> None:
    run = write_running(fixture_root)
    write_progress(run, RoundProgress(3, 5, "training", 2, 3, 0.0))
    at = open_page("federation", {"selected_run": run.name})
    bar = at.get("progress")[0].proto
    assert bar.text == "Round 2 of 5 · round 3: training, 2 of 3 hospitals done · about 1 min 35 s left"
    assert bar.value == int(100 * (2 + 0.8 * 2 / 3) / 5)
    (run / "progress.json").write_text("{damaged")
    at.run()
    assert at.get("progress")[0].proto.text == "Round 2 of 5 · about 1 min 35 s left"  # damaged: rounds only
    assert not at.exception


def _scorecard_links(at: AppTest) -> list[str]:
    return [str(link.proto.label) for link in at.get("page_link") if "scorecard" in str(link.proto.label)]


def test_a_high_auc_next_to_a_low_accuracy_points_to_the_scorecard(fixture_root: Fixture) -> None:
    run = fixture_root.finished
    at = open_page("federation", {"selected_run": run.name})
    assert not [w for w in _texts(at.warning) if "ranks tiles well" in w]  # the fixture's hospitals are fine
    assert _scorecard_links(at) == []
    # Hospital 2 ranks its tiles well but classifies half of them wrongly; hospital 0 sits just inside both limits
    # (AUC 0.8, accuracy just below 0.7); hospital 1's accuracy is exactly 0.7, which is not low.
    changed = {0: (0.8, 0.69), 1: (0.95, 0.7), 2: (0.9375, 0.5)}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        if record["round"] == 2:
            record["test_auc"], record["test_acc"] = changed[record["client"]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    at = open_page("federation", {"selected_run": run.name})
    warned = [w for w in _texts(at.warning) if "ranks tiles well" in w]
    assert warned == [
        "Hospital 0 ranks tiles well (AUC 0.80) but at threshold 0.5 classifies only 69% of its test tiles correctly "
        "(accuracy 0.69): see its operating point on the Hospital page.",
        "Hospital 2 ranks tiles well (AUC 0.94) but at threshold 0.5 classifies only 50% of its test tiles correctly "
        "(accuracy 0.50): see its operating point on the Hospital page.",
    ]
    assert _scorecard_links(at) == ["Open the Hospital page's scorecard"]
    # a multi-class run has no scorecard to point to: no sentence
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"classes": list("0123456789")}), encoding="utf-8")
    at = open_page("federation", {"selected_run": run.name})
    assert not [w for w in _texts(at.warning) if "ranks tiles well" in w]
    assert _scorecard_links(at) == []
