"""infra.records: one error type, with its kind, for the record files the stages leave behind; prepare.json's reader."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from infra.formats import PREPARE_RECORD, hospital_name
from infra.records import RecordError, read_json_object, read_prepare_record


@pytest.mark.parametrize(
    ("text", "kind", "says"),
    [
        (None, "missing", "does not exist"),
        ("{cut", "unreadable", "is not readable JSON"),
        (b"\xff\xfe{}", "unreadable", "is not readable JSON"),
        ("[1, 2]", "malformed", "holds no JSON object"),
    ],
)
def test_read_json_object_names_the_file_and_its_kind(
    tmp_path: Path, text: str | bytes | None, kind: str, says: str
) -> None:
    path = tmp_path / "record.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(RecordError, match=says) as caught:
        read_json_object(path)
    assert caught.value.kind == kind
    assert caught.value.path == path
    assert str(caught.value).startswith(str(path))
    assert caught.value.damaged is (kind != "missing")
    assert (caught.value.cause is None) is (kind == "malformed")


def test_read_prepare_record_types_the_fields_other_stages_read(tmp_path: Path) -> None:
    record = {"classes": ["normal", "abnormal"], "clients": [{"client": 0, "group": "A"}], "shortcut_probe": None}
    (tmp_path / PREPARE_RECORD).write_text(json.dumps(record))
    found = read_prepare_record(tmp_path)
    assert found.path == tmp_path / PREPARE_RECORD
    assert found.data == record
    assert found.classes == ["normal", "abnormal"]
    assert found.hospitals == [{"client": 0, "group": "A"}]
    assert found.shortcut_probe is None
    with pytest.raises(RecordError) as caught:
        read_prepare_record(tmp_path / "elsewhere")
    assert caught.value.kind == "missing"


def test_a_hospital_folder_is_named_in_one_place() -> None:
    assert [hospital_name(i) for i in (0, 7, 12)] == ["client_00", "client_07", "client_12"]


def test_a_record_error_crosses_processes_with_its_kind_and_path(tmp_path: Path) -> None:
    error = RecordError("x is wrong", kind="malformed", path=tmp_path / "x", cause=ValueError("why"))
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.kind, copy.path) == (RecordError, "x is wrong", "malformed", tmp_path / "x")
