"""federation.run_reader: the one reader of a run directory, typed, with one error type and its kind."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from federation.run_reader import RecordError, RunSummary, read_aggregation, read_config, read_summary


def test_a_missing_summary_reads_as_an_empty_one(tmp_path: Path) -> None:
    summary = read_summary(tmp_path)
    assert summary == RunSummary()
    assert (summary.present, summary.status, summary.ended, summary.final, summary.left_out) == (
        False,
        None,
        False,
        {},
        [],
    )


def test_summary_fields_are_typed(tmp_path: Path) -> None:
    data = {
        "status": "finished",
        "pid": 12,
        "pid_started": True,
        "eta_seconds": 3,
        "rounds_done": 2,
        "classes": ["normal", "abnormal"],
        "final": {"avg_test_acc": 0.5},
        "left_out_at_hello": {"1": "no data"},
    }
    (tmp_path / "summary.json").write_text(json.dumps(data))
    summary = read_summary(tmp_path)
    assert summary.present
    assert summary.ended
    assert summary.data == data
    assert (summary.status, summary.pid, summary.pid_started, summary.eta_seconds) == ("finished", 12, None, 3.0)
    assert (summary.rounds_done, summary.classes, summary.final) == (2, ("normal", "abnormal"), {"avg_test_acc": 0.5})
    assert summary.left_out == ["hospital 1 was left out of the whole run at its hello: no data"]
    assert RunSummary({"eta_seconds": math.inf}).eta_seconds is None


@pytest.mark.parametrize(("text", "kind"), [("{cut", "unreadable"), ("[]", "malformed")])
def test_an_unusable_summary_is_a_record_error_with_its_kind(tmp_path: Path, text: str, kind: str) -> None:
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(RecordError) as caught:
        read_summary(tmp_path)
    assert (caught.value.kind, caught.value.path) == (kind, tmp_path / "summary.json")


@pytest.mark.parametrize(
    ("content", "kind", "says"),
    [
        (None, "missing", "does not exist"),
        ("[run\n", "unreadable", "is not valid TOML"),
        (b"\xff", "unreadable", "is not UTF-8 text"),
    ],
)
def test_config_errors_name_the_file_and_kind(
    tmp_path: Path, content: str | bytes | None, kind: str, says: str
) -> None:
    path = tmp_path / "config.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(RecordError, match=says) as caught:
        read_config(tmp_path)
    assert (caught.value.kind, caught.value.path) == (kind, path)


def test_config_reads_its_text_and_tables(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[data]\npath = "data/prepared/demo"\n')
    config = read_config(tmp_path)
    assert config.text.startswith("[data]")
    assert config.value("data", "path") == "data/prepared/demo"
    assert config.value("run", "rounds") is None


def test_aggregation_keeps_records_and_names_damaged_lines(tmp_path: Path) -> None:
    (tmp_path / "aggregation.jsonl").write_text('{"round": 1}\nnot json\n{"round": 2}\n')
    scan = read_aggregation(tmp_path)
    assert scan.records == [{"round": 1}, {"round": 2}]
    assert [bad.line for bad in scan.damaged] == [2]
