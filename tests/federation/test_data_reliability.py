"""Manifest rows under bad input (issue 10, defects 7, 8 and 11 on the reading side): one line naming file and line.

Paths leaving the dataset folder, duplicate rows, a UTF-8 BOM, and empty or non-image tiles.
"""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

import pytest
from support.tiny_dataset import make_dataset

from federation.errors import FederationError
from federation.hospital.data import load_hospitals, read_manifest


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def dataset(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "ds"))


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "manifest.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _write(folder: Path, rows: list[dict[str, str]], encoding: str = "utf-8") -> None:
    with (folder / "manifest.csv").open("w", newline="", encoding=encoding) as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../../x.png", "goes up with '..'"),
        ("client_00/../../outside.png", "goes up with '..'"),
        ("/etc/passwd", "absolute path"),
    ],
)
def test_rows_whose_path_leaves_the_dataset_are_refused(dataset: Path, path: str, why: str) -> None:
    rows = _rows(dataset)
    rows[3]["path"] = path
    _write(dataset, rows)
    with pytest.raises(FederationError) as info:
        read_manifest(dataset)
    message = str(info.value)
    assert message.startswith(f"{dataset / 'manifest.csv'} line 5: ")
    assert why in message
    assert "\n" not in message


def test_a_symlink_leading_out_of_the_dataset_is_refused(dataset: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(dataset / _rows(dataset)[0]["path"], outside / "stolen.png")
    (dataset / "client_00" / "link").symlink_to(outside)
    rows = _rows(dataset)
    rows[0]["path"] = "client_00/link/stolen.png"
    _write(dataset, rows)
    with pytest.raises(FederationError, match=r"manifest\.csv line 2: .*leads outside the dataset folder"):
        read_manifest(dataset)


def test_train_refuses_an_escaping_manifest_in_one_line_with_exit_2(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main

    rows = _rows(dataset)
    rows[0]["path"] = "/etc/passwd"
    _write(dataset, rows)
    run = tmp_path / "runs" / "r1"
    monkeypatch.setattr(sys, "argv", ["gastric-fl", "train", "--data", str(dataset), "--out", str(run), "-q"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    # train announces its run directory first (engine output); the error itself is one line.
    errors = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("run directory:")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"error: {dataset / 'manifest.csv'} line 2: absolute path '/etc/passwd'")
    assert not run.exists()


def test_duplicate_rows_are_refused_naming_both_lines(dataset: Path) -> None:
    rows = _rows(dataset)
    _write(dataset, [*rows[:4], dict(rows[1]), *rows[4:]])
    with pytest.raises(FederationError) as info:
        read_manifest(dataset)
    message = str(info.value)
    assert message.startswith(f"{dataset / 'manifest.csv'} line 6: tile {rows[1]['path']} is already listed on line 3")
    assert "remove the duplicate row" in message


def test_a_manifest_saved_with_a_utf8_bom_is_read(dataset: Path) -> None:
    rows = _rows(dataset)
    _write(dataset, rows, encoding="utf-8-sig")
    assert (dataset / "manifest.csv").read_bytes().startswith(b"\xef\xbb\xbf")
    assert len(read_manifest(dataset)) == len(rows)


@pytest.mark.parametrize(("content", "why"), [(b"", "is empty (0 bytes)"), (b"hello\n", "is not a PNG image")])
def test_an_empty_or_text_tile_is_named_in_one_line(dataset: Path, content: bytes, why: str) -> None:
    victim = dataset / _rows(dataset)[0]["path"]
    victim.write_bytes(content)
    with pytest.raises(FederationError) as info:
        load_hospitals(dataset, input_size=32, hospitals=[0])
    message = str(info.value)
    assert message.startswith(f"tile {victim} {why}")
    assert "re-run gastric-fl prepare" in message
    assert "\n" not in message
