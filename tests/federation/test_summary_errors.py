"""A run's ``summary.json`` read back by the commands that write runs (``federation.summary_errors``): through the one
reader, ``federation.run_reader.read_summary``, and worded as ``train --resume``, ``train --engine flower`` and
``ablate`` have always worded a file they cannot use."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from federation.ablation.running import cell_status
from federation.errors import FederationError
from federation.summary_errors import read_summary_object


def test_a_summary_is_read_whole_and_a_run_without_one_has_an_empty_one(tmp_path: Path) -> None:
    assert read_summary_object(tmp_path) == {}
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "rounds_done": 3}))
    assert read_summary_object(tmp_path) == {"status": "finished", "rounds_done": 3}


def test_a_damaged_summary_is_named_in_the_words_train_has_always_used(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text("{cut off")
    with pytest.raises(FederationError) as caught:
        read_summary_object(tmp_path)
    assert str(caught.value) == (
        f"{path} is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
    )
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)
    path.write_text("[1, 2]")
    with pytest.raises(FederationError) as caught:
        read_summary_object(tmp_path)
    assert str(caught.value) == f"{path} should hold a JSON object"


def test_a_summary_this_user_may_not_read_says_whose_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "summary.json"
    path.write_text("{}")

    def refused(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refused)
    with pytest.raises(FederationError) as caught:
        read_summary_object(tmp_path)
    assert str(caught.value) == (
        f"{path} cannot be read by this user (Permission denied): run the command as the user that wrote it "
        "(for a deployed run: the server's user, on the server machine), or let this user read the folder"
    )


def test_a_failure_these_commands_never_worded_reaches_them_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_bytes(b"\xff\xfe{}")  # not UTF-8: the error itself, as before
    with pytest.raises(UnicodeDecodeError):
        read_summary_object(tmp_path)


def test_an_ablation_cell_with_a_damaged_summary_is_partial(tmp_path: Path) -> None:
    cell = tmp_path / "cell"
    assert cell_status(cell) == "pending"
    cell.mkdir()
    assert cell_status(cell) == "partial"
    (cell / "summary.json").write_text("{cut off")
    assert cell_status(cell) == "partial"  # resumed: its checkpoints decide where it continues
    (cell / "summary.json").write_text(json.dumps({"status": "finished"}))
    assert cell_status(cell) == "finished"
