"""infra.toml.toml_value: the one TOML value writer (run configurations, the dashboard's --set values, the
deployment kit, Flower's config files), checked by exact text and by reading it back with tomllib."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from infra.toml import toml_value


def test_values_are_written_exactly() -> None:
    assert toml_value(True) == "true"
    assert toml_value(3) == "3"
    assert toml_value(0.1) == "0.1"
    assert toml_value("fedsaf") == '"fedsaf"'
    assert toml_value("fedsaf", bare_words=True) == "fedsaf"
    assert toml_value("true", bare_words=True) == '"true"'  # would read back as a boolean
    assert toml_value("data/prepared", bare_words=True) == '"data/prepared"'
    assert toml_value(["a", 2, False]) == '["a", 2, false]'
    assert toml_value(Path("/tmp/x")) == '"/tmp/x"'
    with pytest.raises(TypeError, match="cannot write NoneType"):
        toml_value(None)


@pytest.mark.parametrize("text", ['a "quoted" \\ path', "two\nlines\ttab", "Zürich – 胃", ""])
def test_any_string_reads_back_equal(text: str) -> None:
    assert tomllib.loads(f"key = {toml_value(text)}")["key"] == text
    assert tomllib.loads(f"key = {toml_value([text, text])}")["key"] == [text, text]
