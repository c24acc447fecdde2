"""The run queue: trainings start one at a time (never two at once, whoever starts them), a waiting entry can be
cancelled, the queue is a file that survives the page, its runner leaves once the work is done; and the Compare
page's launcher queues an nhead x dm x seeds grid, lists it and cancels a waiting run."""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support.checks import every
from support.dashboard import Fixture, open_page, wait_until, write_prepared

from app.dashboard import jobs, paths
from app.errors import DashboardError

# A fake training: records when it starts and ends in a shared log, then exits.
FAKE = (
    "import sys, time, json; log = sys.argv[1]; name = sys.argv[2]\n"
    "open(log, 'a').write(json.dumps(['start', name, time.time()]) + '\\n')\n"
    "time.sleep(float(sys.argv[3]))\n"
    "open(log, 'a').write(json.dumps(['end', name, time.time()]) + '\\n')\n"
)


def _entry(tmp_path: Path, name: str, seconds: float = 0.3) -> jobs.QueueEntry:
    command = [sys.executable, "-c", FAKE, str(tmp_path / "events.jsonl"), name, str(seconds)]
    return jobs.QueueEntry(name, "batch", f"Training {name}", str(tmp_path / "runs" / name), command, {}, time.time())


def _events(tmp_path: Path) -> list[tuple[str, str, float]]:
    path = tmp_path / "events.jsonl"
    return [tuple(json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []  # type: ignore[misc]


def test_the_queue_runs_one_job_at_a_time_and_cancel_takes_one_out(tmp_path: Path) -> None:
    folder = tmp_path / ".dashboard" / "jobs"
    jobs.enqueue(folder, [_entry(tmp_path, name) for name in ("a", "b", "c", "d")])
    assert jobs.cancel(folder, "c")
    assert not jobs.cancel(folder, "c")  # once only
    assert [jobs.entry_status(folder, e) for e in jobs.read_queue(folder)] == [
        "queued",
        "queued",
        "cancelled",
        "queued",
    ]
    assert jobs.ensure_runner(folder, tmp_path, interval_s=0.05)
    assert jobs.ensure_runner(folder, tmp_path, interval_s=0.05)  # the same runner, not a second one
    wait_until(lambda: not jobs.has_work(folder))
    events = _events(tmp_path)
    assert [(kind, name) for kind, name, _ in events] == [
        ("start", "a"),
        ("end", "a"),
        ("start", "b"),
        ("end", "b"),
        ("start", "d"),
        ("end", "d"),
    ]  # in order, never overlapping, the cancelled one never ran
    assert [jobs.entry_status(folder, e) for e in jobs.read_queue(folder)] == [
        "succeeded",
        "succeeded",
        "cancelled",
        "succeeded",
    ]
    assert not jobs.cancel(folder, "a")  # a started entry cannot be cancelled
    runner = f"gastric-fl queue {folder.resolve()}"
    wait_until(lambda: runner not in {t.name for t in threading.enumerate()})  # the runner left once the work was done
    assert not jobs.ensure_runner(folder, tmp_path)  # nothing to do: no runner
    assert jobs.clear_finished(folder) == 4
    assert jobs.read_queue(folder) == []


def test_has_work_never_sees_an_entry_between_its_start_mark_and_its_record(tmp_path: Path) -> None:
    """``advance`` marks an entry started, then writes its job's record, under the queue's lock; in between the
    entry reads as ``lost``. ``has_work`` reads under the same lock, so it sees the queue before or after, never
    between: here the holder of the lock marks the entry started without a record and puts it back to waiting
    before it lets go, and ``has_work``, asked meanwhile, answers for the waiting entry."""
    folder = tmp_path / ".dashboard" / "jobs"
    jobs.enqueue(folder, [_entry(tmp_path, "a")])
    entry = jobs.read_queue(folder)[0]
    answers: list[bool] = []
    asking = threading.Thread(target=lambda: answers.append(jobs.has_work(folder)))
    with jobs._locked(folder):
        jobs._write_queue(folder, [replace(entry, started=True)])
        assert jobs.entry_status(folder, jobs.read_queue(folder)[0]) == "lost"  # the moment in between
        asking.start()
        time.sleep(0.3)
        assert answers == []  # it waits for the lock
        jobs._write_queue(folder, [entry])
    asking.join(timeout=10)
    assert answers == [True]


def test_the_queue_waits_for_a_training_started_elsewhere(tmp_path: Path) -> None:
    folder = tmp_path / ".dashboard" / "jobs"
    first = _entry(tmp_path, "page", seconds=1.0)
    running = jobs.start_training(folder, "page", Path(first.target), first.command, tmp_path, first.title)
    jobs.enqueue(folder, [_entry(tmp_path, "queued")])
    assert jobs.advance(folder, tmp_path) is None  # the page's run is training
    with pytest.raises(DashboardError, match="Training page is still training"):
        jobs.start_training(folder, "second", tmp_path / "runs" / "second", first.command, tmp_path, "second")
    # A run from a terminal counts too (the page passes that check as `busy`).
    wait_until(lambda: not jobs.state(folder, running).active)
    assert jobs.advance(folder, tmp_path, busy=lambda: "run x is still training") is None
    started = jobs.advance(folder, tmp_path)
    assert started is not None
    assert started.job_id == "queued"
    assert started.title == "Training queued"
    wait_until(lambda: not jobs.state(folder, started).active)
    assert [name for kind, name, _ in _events(tmp_path) if kind == "start"] == ["page", "queued"]


def test_the_queue_is_a_file_that_survives_and_refuses_a_taken_name(tmp_path: Path) -> None:
    folder = tmp_path / ".dashboard" / "jobs"
    entry = _entry(tmp_path, "a")
    jobs.enqueue(folder, [entry])
    assert jobs.queue_path(folder) == tmp_path / ".dashboard" / "queue.json"
    assert jobs.read_queue(folder) == [entry]  # a reloaded page reads the same queue
    with pytest.raises(DashboardError, match="exists already"):
        jobs.enqueue(folder, [entry])
    (tmp_path / "runs" / "b").mkdir(parents=True)
    with pytest.raises(DashboardError, match="taken by another run"):
        jobs.enqueue(folder, [_entry(tmp_path, "b")])
    jobs.queue_path(folder).write_text("{not json")
    with pytest.raises(DashboardError, match=r"queue\.json is damaged"):
        jobs.read_queue(folder)
    assert not jobs.has_work(folder)


def test_the_launcher_queues_a_grid_and_cancels_a_waiting_run(
    fixture_root: Fixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = paths.jobs_root(fixture_root.root)
    # Keep the queue still while the page is checked: a training from "elsewhere" is running.
    blocker = jobs.start_training(
        folder, "blocker", fixture_root.root / "runs" / "blocker", ["sleep", "30"], fixture_root.root, "Blocker"
    )
    try:
        at = open_page("compare")
        at.multiselect(key="grid_nhead").set_value([0, 3])
        at.multiselect(key="grid_dm").set_value(["manhattan", "euclidean"])
        at.number_input(key="grid_seeds").set_value(2)
        at.number_input(key="grid_rounds").set_value(1)
        at.run()
        button = at.button(key="queue_button")
        assert button.label == "Queue 8 runs"
        assert not button.disabled
        button.click()
        at.run()
        assert not at.exception
        entries = jobs.read_queue(folder)
        assert len(entries) == 8
        assert {(e.params["nhead"], e.params["dm"], e.params["seed"]) for e in entries} == {
            (n, d, s) for n in (0, 3) for d in ("manhattan", "euclidean") for s in (0, 1)
        }
        first = entries[0]
        assert "run.rounds=1" in first.command
        assert "strategy.nhead=0" in first.command  # FedSAF's own default is 6
        assert every("amp.dm=euclidean" in e.command for e in entries if e.params["dm"] == "euclidean")
        assert Path(first.target).parent.parent == fixture_root.root / "runs"
        assert "python -m" not in first.title
        assert first.title.startswith("Training FedSAF on tiny, 1 round (nhead 0, dm manhattan, seed 0)")
        statuses = " ".join(str(m.value) for m in at.markdown)
        assert "8 queued" in statuses
        at.button(key=f"cancel_{entries[1].entry_id}").click()
        at.run()
        assert [jobs.entry_status(folder, e) for e in jobs.read_queue(folder)][:3] == ["queued", "cancelled", "queued"]
        at.button(key="cancel_all").click()
        at.run()
        assert {jobs.entry_status(folder, e) for e in jobs.read_queue(folder)} == {"cancelled"}
        at.segmented_control(key="compare_mode").set_value("Ablation grid")
        at.run()
        assert not at.exception
    finally:
        jobs.stop(folder, blocker)
    assert not any(e.started for e in jobs.read_queue(folder))  # nothing ran while the blocker trained


def test_invalid_launcher_settings_disable_the_queue_button(fixture_root: Fixture) -> None:
    write_prepared(fixture_root.root / "prepared" / "solo", clients=1)
    at = open_page("compare")
    at.selectbox(key="grid_dataset").set_value("solo")
    at.run()
    assert "a federation needs at least 2" in " ".join(str(e.value) for e in at.error)
    assert at.button(key="queue_button").disabled
    at.selectbox(key="grid_dataset").set_value("tiny")
    at.multiselect(key="grid_nhead").set_value([])
    at.run()
    assert not at.error
    assert at.button(key="queue_button").disabled  # nothing chosen, nothing to queue
    assert jobs.read_queue(paths.jobs_root(fixture_root.root)) == []
