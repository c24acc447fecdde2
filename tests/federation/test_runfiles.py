"""The hospital folder names of a run directory, in one place (federation.runfiles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation import runfiles
from federation.engine.hospital import HOSPITALS_DIR, hospital_folder
from federation.flower.kit import hospital_name


def test_names_indices_and_listing(tmp_path: Path) -> None:
    assert runfiles.hospital_name(3) == "client_03" == hospital_name(3)
    assert runfiles.hospital_dir(tmp_path, 12) == tmp_path / "hospitals" / "client_12" == hospital_folder(tmp_path, 12)
    assert runfiles.hospital_index("client_07") == 7
    with pytest.raises(ValueError, match="not a hospital folder name"):
        runfiles.hospital_index("server")
    assert HOSPITALS_DIR == runfiles.HOSPITALS_DIR  # the old name still works
    for name in ("client_01", "client_00", "client_x", "client_100", "other"):
        (tmp_path / "hospitals" / name).mkdir(parents=True)
        (tmp_path / "hospitals" / name / "model.json").write_text("{}")
    found = runfiles.hospital_files(tmp_path, "model.json")
    assert [p.parent.name for p in found] == ["client_00", "client_01"]  # two digits only, by index
