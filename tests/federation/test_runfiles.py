"""The hospital folder names of a run directory, in one place (federation.runfiles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation import runfiles
from federation.flower.kit import hospital_name


def test_names_indices_and_listing(tmp_path: Path) -> None:
    assert runfiles.hospital_name(3) == "client_03" == hospital_name(3)
    assert runfiles.hospital_dir(tmp_path, 12) == tmp_path / "hospitals" / "client_12"
    assert runfiles.hospital_index("client_07") == 7
    with pytest.raises(ValueError, match="not a hospital folder name"):
        runfiles.hospital_index("server")
    for name in ("client_01", "client_00", "client_x", "client_100", "other"):
        (tmp_path / "hospitals" / name).mkdir(parents=True)
        (tmp_path / "hospitals" / name / "model.json").write_text("{}")
    found = runfiles.hospital_files(tmp_path, "model.json")
    assert [p.parent.name for p in found] == ["client_00", "client_01"]  # two digits only, by index


def test_every_run_file_name_comes_from_runfiles() -> None:
    """The modules that write a run's files name them through federation.runfiles, and what a run directory may
    hold (federation.runs.RUN_PATTERNS) covers each of them."""
    from fnmatch import fnmatchcase

    from federation import progress, runs
    from federation.hospital import outbound, privacy, store
    from federation.server import audit

    assert privacy.ACCOUNTANT_FILE is runfiles.ACCOUNTANT_FILE
    assert progress.PROGRESS_FILE is runfiles.PROGRESS_FILE
    assert audit.AUDIT_FILE is runfiles.AUDIT_FILE
    assert outbound.OUTBOUND_FILE is runfiles.OUTBOUND_FILE
    assert store.HOSPITAL_FILE is runfiles.HOSPITAL_FILE
    server = (runfiles.CONFIG_FILE, runfiles.METRICS_FILE, runfiles.AGGREGATION_FILE, runfiles.SUMMARY_FILE)
    own = (runfiles.HOSPITAL_FILE, runfiles.PREDICTIONS_FILE, runfiles.OUTBOUND_FILE, runfiles.ACCOUNTANT_FILE)
    paths = [
        *server,
        runfiles.AUDIT_FILE,
        runfiles.PROGRESS_FILE,
        *(f"{runfiles.REPORT_DIR}/{name}" for name in runfiles.REPORT_FILES),
        *(f"{runfiles.HOSPITALS_DIR}/{runfiles.hospital_name(4)}/{name}" for name in own),
    ]
    assert len(paths) == 4 + 2 + 5 + 4
    for path in paths:
        assert any(fnmatchcase(path, pattern) for pattern in runs.RUN_PATTERNS), path


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_read_predictions_reads_labels_both_ways(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "predictions.csv",
        "client,path,label,prob_abnormal,round\n3,a.png,abnormal,0.75,4\n3,b.png,0,0.125,5\n3,c.png,normal,1,5\n",
    )
    found = runfiles.read_predictions(path)
    assert found == runfiles.HospitalPredictions(
        hospital=3, paths=("a.png", "b.png", "c.png"), labels=(1, 0, 0), probs=(0.75, 0.125, 1.0), round=5
    )
    empty = runfiles.read_predictions(_write(tmp_path / "empty.csv", "client,path,label,prob_abnormal\n"))
    assert empty.paths == ()
    assert empty.hospital is None
    assert empty.round is None


@pytest.mark.parametrize(
    ("text", "damaged", "says"),
    [
        ("client,path,label,prob_abnormal\n1,a.png,maybe,0.5\n", True, "line 2: label must be"),
        ("client,path,label,prob_abnormal\n1,a.png,1,1.5\n", True, "line 2: prob_abnormal must be between 0 and 1"),
        ("client,path,label,prob_abnormal\n1,a.png,1,nan\n", True, "line 2: client and prob_abnormal must be"),
        ("client,path,label,prob_abnormal\n1,a.png,1,0.5\n2,b.png,0,0.5\n", True, "one hospital number, found [1, 2]"),
        ("client,path,label\n2,a.png,normal\n", True, "lacks the column(s) prob_abnormal"),
        ("client,path,label,prob_0,prob_1,round\n1,a.png,0,0.9,0.1,1\n", False, "2-class model's predictions (0, 1)"),
    ],
)
def test_read_predictions_names_what_is_wrong(tmp_path: Path, text: str, damaged: bool, says: str) -> None:
    path = _write(tmp_path / "predictions.csv", text)
    with pytest.raises(runfiles.PredictionsError) as caught:
        runfiles.read_predictions(path)
    assert str(caught.value).startswith(str(path))
    assert says in str(caught.value)
    assert caught.value.damaged is damaged
    assert caught.value.kind == ("malformed" if damaged else "other_task")


def test_read_predictions_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(runfiles.PredictionsError, match="does not exist") as caught:
        runfiles.read_predictions(tmp_path / "predictions.csv")
    assert caught.value.damaged is False
    assert caught.value.kind == "missing"


def _line(round_: int, client: int, acc: float, **extra: object) -> str:
    import json

    record = {"round": round_, "client": client, "test_acc": acc, "test_auc": None, "values_sent": 10}
    record |= {"values_received": 5, "seconds": 1.0, "num_train": 4, "num_test": 2, "trained": True, **extra}
    return json.dumps(record)


def test_read_metrics_leaves_out_damaged_malformed_and_replaced_records(tmp_path: Path) -> None:
    """One reader of metrics.jsonl: a damaged line, a malformed record and a repeated round and hospital (the last
    written counts) are each left out and named by file and line; the rest keep their order."""
    path = tmp_path / "metrics.jsonl"
    lines = [
        _line(1, 0, 0.5),
        _line(1, 1, 0.25),
        "{not json",
        _line(1, 2, 0.75, num_train=2.5),  # a count that is not a whole number
        _line(2, 0, 0.5),
        _line(1, 1, 0.375),  # round 1 of hospital 1 again (a resumed run): this one counts
    ]
    path.write_text("\n".join(lines) + "\n")
    found = runfiles.read_metrics(path)
    assert [(r["round"], r["client"], r["test_acc"]) for r in found.records] == [
        (1, 0, 0.5),
        (2, 0, 0.5),
        (1, 1, 0.375),
    ]
    assert [d.line for d in found.damaged] == [3]
    assert len(found.problems) == 3
    assert "line 3" in found.problems[0]
    assert f"{path}, line 4: num_train is 2.5, not a whole number" in found.problems[1]
    assert f"{path}, line 6: round 1 of hospital 1 is written again" in found.problems[2]
    assert runfiles.read_metrics(tmp_path / "absent.jsonl") == runfiles.MetricsRecords([], (), [])


def test_report_and_dashboard_read_the_same_metrics_records(tmp_path: Path) -> None:
    """``gastric-fl report`` (load_run) and the dashboard's frame (load_metrics) take the same records from one
    metrics.jsonl, left-out records included."""
    from app.run_records import load_metrics
    from federation.report import load_run

    (tmp_path / "config.toml").write_text('[run]\nname = "x"\n')
    lines = [_line(1, 0, 0.5), _line(1, 1, 0.25), _line(1, 2, 0.75, round="one"), _line(2, 0, 0.5), _line(2, 0, 1.0)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run = load_run(tmp_path)
    frame = load_metrics(tmp_path)
    report = [(r["round"], r["client"], r["test_acc"]) for r in run.metrics]
    shown = [(int(r), int(c), float(a)) for r, c, a in frame[["round", "client", "test_acc"]].itertuples(index=False)]
    assert sorted(report) == shown == [(1, 0, 0.5), (1, 1, 0.25), (2, 0, 1.0)]
    assert sum("left out" in p for p in run.problems) == 2


def test_read_cards_reads_each_hospitals_card_and_names_what_is_wrong(tmp_path: Path) -> None:
    """One reader of model.json for the reports and the dashboard: readable cards by hospital, the others left
    out by read_cards and named, with their kind, by read_card_object."""
    folders = {n: tmp_path / "hospitals" / f"client_0{n}" for n in range(4)}
    for folder in folders.values():
        folder.mkdir(parents=True)
    (folders[0] / "model.json").write_text('{"threshold": 0.4}')
    (folders[1] / "model.json").write_text("[1, 2]")
    (folders[2] / "model.json").write_text("{cut")
    (folders[3] / "model.json").write_text('{"threshold": 0.7}')
    assert runfiles.read_cards(tmp_path) == {0: {"threshold": 0.4}, 3: {"threshold": 0.7}}
    for n, kind, says in ((1, "malformed", "holds no JSON object"), (2, "unreadable", "is not readable JSON")):
        with pytest.raises(runfiles.CardError, match=says) as caught:
            runfiles.read_card_object(folders[n] / "model.json")
        assert caught.value.kind == kind
    with pytest.raises(runfiles.CardError, match="does not exist") as missing:
        runfiles.read_card_object(tmp_path / "model.json")
    assert missing.value.kind == "missing"
