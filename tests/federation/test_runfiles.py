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

    from federation import privacy, progress, runs
    from federation.engine import audit, hospital, outbound

    assert privacy.ACCOUNTANT_FILE is runfiles.ACCOUNTANT_FILE
    assert progress.PROGRESS_FILE is runfiles.PROGRESS_FILE
    assert audit.AUDIT_FILE is runfiles.AUDIT_FILE
    assert outbound.OUTBOUND_FILE is runfiles.OUTBOUND_FILE
    assert hospital.HOSPITAL_FILE is runfiles.HOSPITAL_FILE
    server = (runfiles.CONFIG_FILE, runfiles.METRICS_FILE, runfiles.AGGREGATION_FILE, runfiles.SUMMARY_FILE)
    own = (runfiles.HOSPITAL_FILE, runfiles.PREDICTIONS_FILE, runfiles.OUTBOUND_FILE, runfiles.ACCOUNTANT_FILE)
    paths = [
        *server,
        runfiles.AUDIT_FILE,
        runfiles.PROGRESS_FILE,
        *(f"{runfiles.REPORT_DIR}/{name}" for name in runfiles.REPORT_FILES),
        *(f"{runfiles.HOSPITALS_DIR}/{runfiles.hospital_name(4)}/{name}" for name in own),
    ]
    assert len(paths) == 4 + 2 + 4 + 4
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
        client=3, paths=("a.png", "b.png", "c.png"), labels=(1, 0, 0), probs=(0.75, 0.125, 1.0), round=5
    )
    empty = runfiles.read_predictions(_write(tmp_path / "empty.csv", "client,path,label,prob_abnormal\n"))
    assert empty.paths == ()
    assert empty.client is None
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
    assert caught.value.kind == ("damaged" if damaged else "other_task")


def test_read_predictions_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(runfiles.PredictionsError, match="does not exist") as caught:
        runfiles.read_predictions(tmp_path / "predictions.csv")
    assert caught.value.damaged is False
    assert caught.value.kind == "missing"
