"""Damaged run files (issue 10, defect 4): readers name the file and line; `report` flags rounds missing hospitals.

With the last line of ``metrics.jsonl`` cut in half, ``report`` used to average round 3 over two of three hospitals
and drop one hospital from its table, without a word.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from federation.jsonl import scan_jsonl
from federation.report import load_run, per_hospital, summarise


def _record(r: int, c: int, acc: float) -> dict[str, Any]:
    return {
        "round": r,
        "client": c,
        "train_loss": 0.5,
        "test_loss": 0.6,
        "test_acc": acc,
        "test_auc": acc,
        "values_sent": 10,
        "values_received": 5,
        "num_train": 10,
        "num_test": 4,
    }


def _run(folder: Path, rounds: int = 3, clients: int = 3) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text('[strategy]\nname = "fedavg"\n[model]\nname = "m"\n')
    lines = [json.dumps(_record(r, c, 0.5 + 0.1 * c + 0.01 * r)) for r in range(1, rounds + 1) for c in range(clients)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "aggregation.jsonl").write_text(
        "".join(json.dumps({"round": r, "seconds": 1.0}) + "\n" for r in range(1, rounds + 1))
    )
    return folder


def _cut_last_line(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])


def test_scan_names_every_damaged_line_with_its_file_and_number(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2, oops}\n[1, 2]\n{"round": 3}\n{"round": 4, "cli')
    scan = scan_jsonl(path)
    assert scan.records == [{"round": 1}, {"round": 3}]
    assert [(d.line, d.last) for d in scan.damaged] == [(2, False), (3, False), (5, True)]
    assert str(scan.damaged[0]).startswith(f"{path}, line 2: not valid JSON")
    assert str(scan.damaged[1]) == f"{path}, line 3: not a JSON object"
    assert str(scan.damaged[2]).startswith(f"{path}, line 5: cut off")


def test_report_flags_a_cut_last_line_and_uses_the_last_complete_round(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "r1")
    _cut_last_line(run_dir / "metrics.jsonl")
    run = load_run(run_dir)
    assert run.problems == [
        f"{run_dir / 'metrics.jsonl'}, line 9: cut off (not valid JSON); the record is left out",
        f"{run_dir / 'metrics.jsonl'}: round 3 has 2 of 3 hospitals (client 2 missing); the figures use round 2, "
        "the last complete round",
    ]
    row = summarise([run])[0]
    assert row["rounds"] == 2
    assert row["avg_test_acc"] == pytest.approx(0.62)  # mean of 0.52, 0.62, 0.72
    assert [h["client"] for h in per_hospital([run])] == [0, 1, 2]


def test_report_command_prints_each_problem_on_one_line_and_in_report_md(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    run_dir = _run(tmp_path / "r1")
    _cut_last_line(run_dir / "metrics.jsonl")
    before = (run_dir / "metrics.jsonl").read_bytes()
    monkeypatch.setattr(sys, "argv", ["gastric-fl", "report", str(run_dir)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0  # flagged, not refused: the complete rounds are still reported
    err = capsys.readouterr().err.splitlines()
    warnings = [line for line in err if line.startswith("warning: ")]
    assert warnings == [
        f"warning: {run_dir / 'metrics.jsonl'}, line 9: cut off (not valid JSON); the record is left out",
        f"warning: {run_dir / 'metrics.jsonl'}: round 3 has 2 of 3 hospitals (client 2 missing); the figures use "
        "round 2, the last complete round",
    ]
    report = (run_dir / "report.md").read_text()
    assert "## Problems" in report
    assert "round 3 has 2 of 3 hospitals" in report
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # the run's own files are never rewritten


def test_a_damaged_line_in_the_middle_is_named(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "r1")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[4] = lines[4][:20]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run = load_run(run_dir)
    assert run.problems[0].startswith(f"{run_dir / 'metrics.jsonl'}, line 5: not valid JSON")
    assert "round 2 has 2 of 3 hospitals (client 1 missing)" in run.problems[1]
    assert summarise([run])[0]["rounds"] == 3  # round 3 is complete: it is the final round
    assert summarise([run])[0]["best_round"] in (1, 3)


def test_a_healthy_run_has_no_problems(tmp_path: Path) -> None:
    run = load_run(_run(tmp_path / "r1"))
    assert run.problems == []
    assert summarise([run])[0]["rounds"] == 3


def test_a_null_accuracy_is_left_out_of_the_mean_not_a_crash(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "r1", rounds=2)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last["test_acc"] = None  # the engine writes null for a non-finite metric
    lines[-1] = json.dumps(last)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    row = summarise([load_run(run_dir)])[0]
    assert row["rounds"] == 2
    assert row["avg_test_acc"] == pytest.approx(0.57)  # mean of 0.52 and 0.62


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("round", "two", "round is 'two', not a whole number"),
        ("client", None, "client is None, not a whole number"),
        ("test_acc", "high", "test_acc is 'high', not a number or null"),
        ("values_sent", 1.5, "values_sent is 1.5, not a whole number"),
    ],
)
def test_a_malformed_metrics_record_is_named_and_left_out_not_a_traceback(
    tmp_path: Path, field: str, value: Any, words: str
) -> None:
    run = _run(tmp_path / "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[4])  # round 2, client 1: line 5 of the file
    record[field] = value
    lines[4] = json.dumps(record)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = load_run(run)
    assert f"{run / 'metrics.jsonl'}, line 5: {words}; the record is left out" in result.problems
    assert len(result.metrics) == 8
    # round 3 stays complete and is the one the figures use
    assert summarise([result])[0]["avg_test_acc"] == pytest.approx((0.53 + 0.63 + 0.73) / 3)


def test_a_summary_another_user_wrote_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployed run's folder is written by the server's user; read by another user, it is one line saying who can
    read it (the refusal is played by the file system call itself: root reads any file)."""
    from federation.errors import FederationError
    from federation.runs import read_json

    path = tmp_path / "summary.json"
    path.write_text("{}")

    def refuse(self: Path, *args: Any, **kwargs: Any) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(FederationError) as info:
        read_json(path)
    message = str(info.value)
    assert message.startswith(f"{path} cannot be read by this user (Permission denied)")
    assert "run the command as the user that wrote it" in message
