"""federation.jsonl.read_jsonl: a torn last line is always left out; damage earlier is skipped or reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.errors import FederationError
from federation.jsonl import read_jsonl


def test_missing_file_is_empty_and_torn_last_line_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path) == []
    path.write_text('{"round": 1, "client": 0}\n{"round": 1, "cli')
    assert read_jsonl(path) == [{"round": 1, "client": 0}]
    assert read_jsonl(path, damaged="raise") == [{"round": 1, "client": 0}]


def test_damage_before_the_last_line_is_skipped_or_named(tmp_path: Path) -> None:
    path = tmp_path / "aggregation.jsonl"
    path.write_text('{"round": 1}\nnot json\n{"round": 2}\n')
    assert read_jsonl(path) == [{"round": 1}, {"round": 2}]
    with pytest.raises(FederationError, match=r"aggregation\.jsonl, line 2: not valid JSON"):
        read_jsonl(path, damaged="raise")
