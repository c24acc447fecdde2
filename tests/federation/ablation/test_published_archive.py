"""A published folder's run records in one deterministic ``cells.tar.xz`` (`federation.ablation.archive`): packing
the same records gives the same bytes, readers unpack it, and the committed tables rebuild from it byte for byte."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support.paths import REPO
from typer.testing import CliRunner

from federation.ablation import CELLS_ARCHIVE, cells_folder, pack_files, pack_folder, unpack
from federation.errors import FederationError

# The smallest published tables (6 and 12 runs): rebuilt here from their archives alone.
SMALL_TABLES = ("results/honest_privacy/none_plain", "results/methods_digits")
TABLE_SUFFIXES = (".md", ".csv", ".png")


def _records(root: Path) -> Path:
    cells = root / "cells"
    for run, text in (("b_seed-0", "b"), ("a_seed-1", "a1"), ("a_seed-0", "a0")):
        (cells / run).mkdir(parents=True)
        (cells / run / "summary.json").write_text(f'{{"id": "{text}"}}\n', encoding="utf-8")
        (cells / run / "metrics.jsonl").write_text(f'{{"round": 1, "id": "{text}"}}\n', encoding="utf-8")
    return cells


def test_packing_the_same_records_gives_the_same_bytes(tmp_path: Path) -> None:
    cells = _records(tmp_path / "one")
    pack_folder(cells, tmp_path / "one.tar.xz")
    # the same records written at another moment, with other modes and in another order
    other = tmp_path / "two" / "cells"
    for path in sorted(cells.rglob("*"), reverse=True):
        if path.is_file():
            target = other / path.relative_to(cells)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
            os.chmod(target, 0o600)
            os.utime(target, (1_000_000, 1_000_000))
    pack_folder(other, tmp_path / "two.tar.xz")
    assert (tmp_path / "one.tar.xz").read_bytes() == (tmp_path / "two.tar.xz").read_bytes()
    with tarfile.open(tmp_path / "one.tar.xz", "r:xz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members][:3] == ["cells", "cells/a_seed-0", "cells/a_seed-0/metrics.jsonl"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.mode for m in members if m.isfile()} == {0o644}
    assert {m.mode for m in members if m.isdir()} == {0o755}


def test_a_reader_uses_cells_when_there_and_else_unpacks_the_archive(tmp_path: Path) -> None:
    folder = tmp_path / "published"
    cells = _records(folder)
    with cells_folder(folder) as found:
        assert found == cells  # an ablation's own folder
    pack_folder(cells, folder / CELLS_ARCHIVE)
    shutil.rmtree(cells)
    with cells_folder(folder) as found:
        assert found != cells
        assert sorted(p.name for p in found.iterdir()) == ["a_seed-0", "a_seed-1", "b_seed-0"]
        assert (found / "a_seed-1" / "summary.json").read_text(encoding="utf-8") == '{"id": "a1"}\n'
        unpacked = found
    assert not unpacked.exists()  # the temporary folder is removed
    assert not cells.exists()  # and nothing is unpacked into the published folder
    with cells_folder(tmp_path / "empty") as found:
        assert found == tmp_path / "empty" / "cells"


def test_an_archive_member_outside_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("x", encoding="utf-8")
    with pytest.raises(FederationError, match="relative name inside"):
        pack_files({"../x.txt": tmp_path / "x.txt"}, tmp_path / "bad.tar.xz")
    assert not list(tmp_path.glob("*.tar.xz"))
    assert not list(tmp_path.glob(".*partial"))
    with tarfile.open(tmp_path / "link.tar.xz", "w:xz") as tar:
        link = tarfile.TarInfo("cells/run")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc"
        tar.addfile(link)
    with pytest.raises(FederationError, match="not a plain file or folder"):
        unpack(tmp_path / "link.tar.xz", tmp_path / "into")


@pytest.mark.parametrize("table", SMALL_TABLES)
def test_a_published_table_rebuilds_from_its_archive_byte_for_byte(
    table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committed folder copied without its tables: ``gastric-fl ablate --tables-only`` (the command its
    COMMAND.md gives, with ``--out`` the copy) writes them again from ``cells.tar.xz`` alone, byte for byte."""
    from app.cli import app

    published = REPO / table
    assert (published / CELLS_ARCHIVE).is_file()
    assert not (published / "cells").exists()  # the records are published only as the archive
    copy = tmp_path / "copy"
    shutil.copytree(published, copy)
    tables = {p.name: p.read_bytes() for p in published.iterdir() if p.suffix in TABLE_SUFFIXES}
    tables.pop("COMMAND.md")
    assert "results.md" in tables
    for name in tables:
        (copy / name).unlink()
    line = next(x for x in (published / "COMMAND.md").read_text(encoding="utf-8").splitlines() if "--tables-only" in x)
    words = line.split()[1:]
    words[words.index("--out") + 1] = str(copy)
    monkeypatch.chdir(REPO)  # the preset is named relative to the repository, as in the published results.md
    result = CliRunner().invoke(app, words)
    assert result.exit_code == 0, result.output
    assert {name: (copy / name).read_bytes() for name in tables} == tables
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in published.iterdir())  # nothing unpacked


def test_the_rebuild_command_rebuilds_a_small_table_identically() -> None:
    """``scripts/rebuild_results.sh`` on the smallest published table: every file as committed (it rebuilds in
    place, so it runs only where that folder has no uncommitted change)."""
    table = SMALL_TABLES[0]
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout (the command compares with the committed files)")
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", table], cwd=REPO, capture_output=True, text=True, check=True
    )
    if status.stdout.strip():
        pytest.skip(f"{table} has uncommitted changes")
    done = subprocess.run(
        ["bash", "scripts/rebuild_results.sh", table.removeprefix("results/")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every published table rebuilt byte-identical" in done.stdout
