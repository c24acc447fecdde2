"""infra.outputs.replace_folder: the one way a whole output folder is replaced (prepare, synth, the kit, publishing).

Every test checks the exact state of the parent folder afterwards: the target's files and bytes, and that no
hidden ``.<name>.partial-*`` or ``.<name>.old-*`` sibling is left.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.outputs import MARKER_NAME, OutputError, recover_folder, replace_folder, write_marker


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder`` (relative path -> bytes, ``None`` for a folder)."""
    return {
        p.relative_to(folder).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))
    }


def _old(parent: Path) -> Path:
    target = parent / "out"
    (target / "sub").mkdir(parents=True)
    (target / "a.txt").write_bytes(b"old a")
    (target / "sub" / "b.txt").write_bytes(b"old b")
    return target


OLD_TREE: dict[str, bytes | None] = {"a.txt": b"old a", "sub": None, "sub/b.txt": b"old b"}


def _siblings(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def _replace(target: Path, write: Callable[[Path], object], keep: Callable[[str], bool] | None = None) -> None:
    """Replace ``target`` with what ``write`` puts into the temporary folder."""
    with replace_folder(target, keep=keep) as tmp:
        write(tmp)


def _write(name: str, data: bytes, then: BaseException | None = None) -> Callable[[Path], None]:
    """A block that writes ``name`` into the temporary folder, then raises ``then`` (if given)."""

    def write(tmp: Path) -> None:
        (tmp / name).write_bytes(data)
        if then is not None:
            raise then

    return write


def _final_rename_of(target: Path) -> Callable[[Path, Path], bool]:
    return lambda src, dst: dst == target and src.name.startswith(f".{target.name}.partial-")


def _failing_rename(fails: Callable[[Path, Path], bool], error: BaseException) -> Callable[[object, object], None]:
    """``os.rename`` that raises ``error`` for the renames ``fails`` picks and does the others."""
    real = os.rename

    def rename(src: object, dst: object) -> None:
        if fails(Path(str(src)), Path(str(dst))):
            raise error
        real(src, dst)  # type: ignore[arg-type]

    return rename


def test_the_new_content_replaces_the_old_and_nothing_is_left_beside_it(tmp_path: Path) -> None:
    target = _old(tmp_path)
    with replace_folder(target) as tmp:
        assert tmp.parent == tmp_path
        assert tmp.name.startswith(".out.partial-")
        assert tmp.is_dir()
        assert not any(tmp.iterdir())
        assert _tree(target) == OLD_TREE  # untouched while the new content is written
        (tmp / "c.txt").write_bytes(b"new c")
    assert _tree(target) == {"c.txt": b"new c"}
    assert _siblings(tmp_path) == ["out"]


def test_a_missing_target_is_created(tmp_path: Path) -> None:
    with replace_folder(tmp_path / "out") as tmp:
        (tmp / "x").write_bytes(b"x")
    assert _tree(tmp_path / "out") == {"x": b"x"}
    assert _siblings(tmp_path) == ["out"]


def test_an_empty_target_is_filled(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with replace_folder(tmp_path / "out") as tmp:
        (tmp / "x").write_bytes(b"x")
    assert _tree(tmp_path / "out") == {"x": b"x"}
    assert _siblings(tmp_path) == ["out"]


def test_a_failure_while_writing_leaves_the_old_folder_untouched_and_nothing_beside_it(tmp_path: Path) -> None:
    target = _old(tmp_path)
    with pytest.raises(RuntimeError, match="disk gone"):
        _replace(target, _write("half.txt", b"half", RuntimeError("disk gone")))
    assert _tree(target) == OLD_TREE
    assert _siblings(tmp_path) == ["out"]


@pytest.mark.parametrize("existing", [True, False])
def test_an_interruption_while_writing_leaves_nothing_behind(tmp_path: Path, existing: bool) -> None:
    target = _old(tmp_path) if existing else tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _replace(target, _write("half.txt", b"half", KeyboardInterrupt()))
    assert _siblings(tmp_path) == (["out"] if existing else [])
    if existing:
        assert _tree(target) == OLD_TREE


def test_a_failing_final_rename_puts_the_old_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _old(tmp_path)
    error = OSError(28, "No space left on device")
    monkeypatch.setattr(os, "rename", _failing_rename(_final_rename_of(target), error))
    with pytest.raises(OSError, match="No space left on device"):
        _replace(target, _write("c.txt", b"new c"))
    assert _tree(target) == OLD_TREE
    assert _siblings(tmp_path) == ["out"]  # the backup renamed back, the new folder removed


def test_an_interruption_at_the_final_rename_puts_the_old_folder_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _old(tmp_path)
    monkeypatch.setattr(os, "rename", _failing_rename(_final_rename_of(target), KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        _replace(target, _write("c.txt", b"new c"))
    assert _tree(target) == OLD_TREE
    assert _siblings(tmp_path) == ["out"]


def test_a_failure_moving_the_old_folder_aside_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _old(tmp_path)
    error = PermissionError(13, "Permission denied")
    monkeypatch.setattr(os, "rename", _failing_rename(lambda src, dst: src == target and ".old-" in dst.name, error))
    with pytest.raises(PermissionError, match="Permission denied"):
        _replace(target, _write("c.txt", b"new c"))
    assert _tree(target) == OLD_TREE
    assert _siblings(tmp_path) == ["out"]


def test_the_swap_moves_the_old_folder_to_a_hidden_backup_and_fsyncs_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _old(tmp_path)
    renames: list[tuple[str, str]] = []
    fsynced: list[int] = []
    real_rename, real_fsync = os.rename, os.fsync

    def rename(src: str, dst: str) -> None:
        renames.append((Path(src).name, Path(dst).name))
        real_rename(src, dst)

    def fsync(fd: int) -> None:
        fsynced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "fsync", fsync)
    with replace_folder(target) as tmp:
        (tmp / "c.txt").write_bytes(b"new c")
    assert len(renames) == 2
    (first_src, backup), (partial, final) = renames
    assert first_src == "out"
    assert backup.startswith(".out.old-")
    assert partial == tmp.name
    assert final == "out"
    assert fsynced == [tmp_path.stat().st_ino]
    assert _siblings(tmp_path) == ["out"]


def test_mode_is_that_of_the_new_folder(tmp_path: Path) -> None:
    with replace_folder(tmp_path / "out", mode=0o700) as tmp:
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o700


def test_a_file_or_a_link_at_the_target_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"a file")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for name in ("f", "link"):
        with pytest.raises(OutputError, match=rf"{name} is not a folder \(a file or a link is never replaced\)"):
            _replace(tmp_path / name, lambda _: pytest.fail("the block must not run"))
    assert (tmp_path / "f").read_bytes() == b"a file"
    assert (tmp_path / "link").is_symlink()
    assert _siblings(tmp_path) == ["f", "link", "real"]


def test_a_file_put_at_the_target_while_writing_is_refused_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "out"

    def write(tmp: Path) -> None:
        (tmp / "c.txt").write_bytes(b"new c")
        target.write_bytes(b"someone's file")  # another program, meanwhile

    with pytest.raises(OutputError, match="out is not a folder"):
        _replace(target, write)
    assert target.read_bytes() == b"someone's file"
    assert _siblings(tmp_path) == ["out"]


# --- keep: entries of the old folder that are not the command's ---------------------------------------------------


def test_kept_entries_of_the_old_folder_are_carried_into_the_new_one(tmp_path: Path) -> None:
    target = _old(tmp_path)
    (target / "notes.txt").write_bytes(b"mine")
    with replace_folder(target, keep=lambda name: name == "notes.txt") as tmp:
        assert not (tmp / "notes.txt").exists()  # carried only at the swap
        (tmp / "c.txt").write_bytes(b"new c")
    assert _tree(target) == {"c.txt": b"new c", "notes.txt": b"mine"}
    assert _siblings(tmp_path) == ["out"]


def test_kept_entries_go_back_when_the_final_rename_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _old(tmp_path)
    (target / "notes").mkdir()
    (target / "notes" / "n.txt").write_bytes(b"mine")
    error = OSError(5, "Input/output error")
    monkeypatch.setattr(os, "rename", _failing_rename(_final_rename_of(target), error))
    with pytest.raises(OSError, match="Input/output error"):
        _replace(target, _write("c.txt", b"new c"), keep=lambda name: name == "notes")
    assert _tree(target) == {**OLD_TREE, "notes": None, "notes/n.txt": b"mine"}
    assert _siblings(tmp_path) == ["out"]


def test_a_kept_entry_the_new_content_also_writes_is_refused(tmp_path: Path) -> None:
    target = _old(tmp_path)
    with pytest.raises(OutputError, match=r"out/a\.txt, which the new content also writes; refusing to replace it"):
        _replace(target, _write("a.txt", b"new a"), keep=lambda name: name == "a.txt")
    assert _tree(target) == OLD_TREE
    assert _siblings(tmp_path) == ["out"]


# --- recover_folder: what a killed run (kill -9) left beside the target -------------------------------------------


def _marked(folder: Path, command: str, *, complete: bool) -> Path:
    folder.mkdir()
    (folder / "x.png").write_bytes(b"x")
    write_marker(folder, command, complete=complete, record_contents=complete)
    return folder


def test_recover_removes_own_partial_folders_and_puts_a_parked_folder_back(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _marked(tmp_path / ".out.partial-dead", "prepare", complete=False)
    parked = _marked(tmp_path / ".out.old-killed", "prepare", complete=True)
    before = _tree(parked)
    foreign = tmp_path / ".out.partial-unknown"
    foreign.mkdir()
    (foreign / "keep.txt").write_bytes(b"someone else's")
    _marked(tmp_path / ".out.partial-synth", "synth", complete=False)
    recover_folder(target, "prepare")
    assert _tree(target) == before
    assert _siblings(tmp_path) == [".out.partial-synth", ".out.partial-unknown", "out"]  # not prepare's: kept
    assert json.loads((target / MARKER_NAME).read_text())["command"] == "prepare"


def test_recover_removes_a_parked_folder_when_the_target_is_back(tmp_path: Path) -> None:
    target = _marked(tmp_path / "out", "prepare", complete=True)
    _marked(tmp_path / ".out.old-killed", "prepare", complete=True)
    recover_folder(target, "prepare")
    assert _siblings(tmp_path) == ["out"]


def test_check_addable_takes_a_new_empty_or_own_folder_only(tmp_path: Path) -> None:
    """The check of commands that add to and replace only their own files in --out (report --html, predict)."""
    from infra.outputs import OutputError, check_addable, write_marker

    check_addable(tmp_path / "new", "predict")
    (tmp_path / "empty").mkdir()
    check_addable(tmp_path / "empty", "predict")
    own = tmp_path / "own"
    own.mkdir()
    (own / "a.png").write_bytes(b"x")
    write_marker(own, "predict")
    check_addable(own, "predict")
    with pytest.raises(
        OutputError, match=r"--out .*own holds files gastric-fl report did not write.*\(report --html adds"
    ):
        check_addable(own, "report", what="report --html")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match=r"--out .*file is not a folder; choose another --out"):
        check_addable(tmp_path / "file", "predict")
