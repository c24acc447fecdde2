"""A hand-edited model card and a forged ``--by``/``--reason`` (issue 48, part 5): the card's threshold history must
describe its threshold, and what goes into it is one printable, bounded line. Each refusal is one line naming the
card or the option, exit status 2, and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.cli import run_cli
from support.slides import TinyRun

from models.bundle import MAX_REASON, BundleError, read_card, set_threshold


def _bundle(tiny_run: TinyRun, tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run, run, ignore=shutil.ignore_patterns("slides", "checkpoints"))
    return run, run / "hospitals" / "client_00"


def _edit(folder: Path, **fields: Any) -> None:
    card = json.loads((folder / "model.json").read_text(encoding="utf-8"))
    card.update(fields)
    (folder / "model.json").write_text(json.dumps(card), encoding="utf-8")


def _predict(monkeypatch: pytest.MonkeyPatch, tiny_run: TinyRun, folder: Path, out: Path) -> int:
    slide = tiny_run.raw / "slide_0000.png"
    return run_cli(
        monkeypatch, "predict", "--model", str(folder), "--slide", str(slide), "--out", str(out), "--no-progress"
    )


def test_a_hand_edited_threshold_with_the_default_source_is_refused_by_predict(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, folder = _bundle(tiny_run, tmp_path)
    _edit(folder, threshold=0.9)  # before: predict printed "threshold 0.90 (the default 0.5)"
    assert _predict(monkeypatch, tiny_run, folder, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {folder / 'model.json'}: threshold 0.9 says it is the default 0.5: the card was changed outside "
        "gastric-fl threshold; put back threshold = 0.5 (then set it with gastric-fl threshold) or export the bundle "
        "again"
    )
    assert not (tmp_path / "out").exists()


def test_a_threshold_edited_after_a_saved_change_is_refused_naming_the_last_change(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run, folder = _bundle(tiny_run, tmp_path)
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--value", "0.3", "--by", "Dr A") == 0
    capsys.readouterr()
    _edit(folder, threshold=0.9)  # the history still ends at 0.3, set by hand
    with pytest.raises(BundleError) as err:
        read_card(folder)
    assert str(err.value) == (
        f"{folder / 'model.json'}: threshold 0.9 (set by hand) is not where threshold_history's last change ended "
        "(0.3, set by hand): the card was changed outside gastric-fl threshold; put back threshold = 0.3 with its "
        "source, or export the bundle again"
    )
    card = (folder / "model.json").read_bytes()
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--value", "0.4") == 2
    assert "is not where threshold_history's last change ended (0.3, set by hand)" in capsys.readouterr().err
    assert (folder / "model.json").read_bytes() == card  # nothing written over the edited card


@pytest.mark.parametrize(
    ("history", "words"),
    [
        (["garbage"], "threshold_history entry 1 of 1 is not a threshold change (keys ['from', 'to', 'source', "),
        ("garbage", "threshold_history is a str, not a list of changes"),
        (
            [{"from": 0.5, "to": 7, "source": "set by hand", "split": "", "by": "x", "at": "", "reason": ""}],
            "threshold_history entry 1 of 1: to = 7 is not a threshold strictly between 0 and 1",
        ),
        (
            [
                {"from": 0.5, "to": 0.3, "source": "set by hand", "split": "", "by": "x", "at": "", "reason": ""},
                {"from": 0.7, "to": 0.3, "source": "set by hand", "split": "", "by": "x", "at": "", "reason": ""},
            ],
            "threshold_history entry 2 of 2 starts from 0.7, but the change before it ended at 0.3",
        ),
        (
            [{"from": 0.5, "to": 0.3, "source": "set by hand", "split": "", "by": "x\nthreshold: 0.9", "at": ""}],
            "not a threshold change",
        ),
        (
            [
                {
                    "from": 0.5,
                    "to": 0.3,
                    "source": "set by hand",
                    "split": "",
                    "by": "x\nthreshold: 0.9",
                    "at": "",
                    "reason": "",
                }
            ],
            "threshold_history entry 1 of 1: by holds the control character '\\n': write it on one line",
        ),
    ],
)
def test_garbage_history_entries_are_refused_in_one_line(
    tiny_run: TinyRun, tmp_path: Path, history: Any, words: str
) -> None:
    _, folder = _bundle(tiny_run, tmp_path)
    _edit(folder, threshold=0.3, threshold_source="set by hand", threshold_history=history)
    with pytest.raises(BundleError) as err:
        read_card(folder)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{folder / 'model.json'}: "), message
    assert words in message, message
    assert message.endswith("the card was changed outside gastric-fl threshold"), message


@pytest.mark.parametrize(
    ("flag", "text", "line"),
    [
        (
            "--by",
            "Dr A\nthreshold: 0.9",
            "error: --by holds the control character '\\n': write it on one line, in printable characters",
        ),
        (
            "--reason",
            "ok\x1b[2Jcleared",
            "error: --reason holds the control character '\\x1b': write it on one line, in printable characters",
        ),
        ("--reason", "x" * 100_000, f"error: --reason is 100000 characters long: keep it to {MAX_REASON}"),
    ],
)
def test_a_forged_or_huge_by_or_reason_is_refused_and_nothing_is_written(
    tiny_run: TinyRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    text: str,
    line: str,
) -> None:
    run, folder = _bundle(tiny_run, tmp_path)
    card = (folder / "model.json").read_bytes()
    assert run_cli(monkeypatch, "threshold", str(run), "--hospital", "0", "--value", "0.3", flag, text) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == line
    assert "threshold: 0.9" not in captured.out
    assert (folder / "model.json").read_bytes() == card


def test_set_threshold_itself_refuses_a_control_character_in_the_reason(tiny_run: TinyRun, tmp_path: Path) -> None:
    _, folder = _bundle(tiny_run, tmp_path)
    card = (folder / "model.json").read_bytes()
    with pytest.raises(BundleError) as err:
        set_threshold(folder, 0.3, "set by hand", by="Dr A", reason="board\rthreshold: 0.9")
    assert str(err.value) == (
        "reason holds the control character '\\r': write it on one line, in printable characters; the card was not "
        "changed"
    )
    assert (folder / "model.json").read_bytes() == card
    # a well-formed change after it keeps the history whole: from 0.5 to 0.3, its last entry the threshold
    after = set_threshold(folder, 0.3, "set by hand", by="Dr A", reason="tumour board 12 Nov")
    assert [(h["from"], h["to"]) for h in after.threshold_history] == [(0.5, 0.3)]
    assert read_card(folder) == after


def test_the_dashboard_and_the_html_report_do_not_trust_a_hand_edited_card(
    tiny_run: TinyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # They read model.json as JSON (no torch): before, a hand-edited threshold was shown as "the default 0.5" on
    # the dashboard's verdicts and used by the HTML report.
    from app.run_cards import card_operating, card_threshold_sources

    run, folder = _bundle(tiny_run, tmp_path)
    assert card_operating(run)[0].source == "the default 0.5"
    _edit(folder, threshold=0.9)
    why = (
        "threshold 0.9 says it is the default 0.5: the card was changed outside gastric-fl threshold; put back "
        "threshold = 0.5 (then set it with gastric-fl threshold) or export the bundle again"
    )
    assert card_operating(run)[0].source == f"NOT TRUSTED: {why}"
    assert card_operating(run)[0].value == 0.9
    assert card_threshold_sources(run)[0] == f"NOT TRUSTED: {why}"
    out = tmp_path / "report"
    assert run_cli(monkeypatch, "report", str(run), "--html", "--hospital", "0", "--out", str(out)) == 2
    assert capsys.readouterr().err.strip() == f"error: {folder / 'model.json'}: {why}"
    assert not out.exists()
