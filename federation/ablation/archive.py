"""A published ablation's run records as one archive, ``cells.tar.xz``, beside its tables.

A published folder (``results/NAME``, written by ``gastric-fl ablate --publish``) keeps the pages a person reads
loose (``results.md``, ``paired.md``, the CSV files and figures, ``COMMAND.md``, ``versions.txt``) and every run's
records (``cells/<run>/config.toml``, ``summary.json``, ``metrics.jsonl``, ``aggregation.jsonl``) in one compressed
archive: thousands of small records are then one file, which a search of the code does not read as source.
``tar -xJf cells.tar.xz`` in the folder unpacks them into ``cells/`` as an ablation's own folder holds them.

The archive is deterministic, so packing the same records again gives the same bytes (a commit that re-publishes
unchanged records changes nothing): members sorted by name, folders before what they hold, modification time 0,
owner and group 0 without names, mode 0644 for files and 0755 for folders, the POSIX (pax) format, xz at its
default preset. Readers (`cells_folder`) use the ``cells/`` folder when there is one, else unpack the archive into a
temporary folder that is removed afterwards.
"""

from __future__ import annotations

import io
import lzma
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from federation.ablation.running import CELLS_DIR
from federation.errors import FederationError

CELLS_ARCHIVE = f"{CELLS_DIR}.tar.xz"
_FILE_MODE = 0o644
_FOLDER_MODE = 0o755


def _member(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    """A member's header with nothing of the machine or the moment in it (see the module docstring)."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_files(files: Mapping[str, Path], archive: Path) -> None:
    """Write ``archive`` (``.tar.xz``) holding each ``files`` value under its key (a relative POSIX name such as
    ``cells/run/summary.json``), with the folders above them, deterministically (module docstring).

    Written to a hidden sibling and renamed into place, so an interrupted pack leaves no half archive.
    """
    folders: set[str] = set()
    for name in files:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise FederationError(f"{name!r}: an archive member must be a relative name inside the archive")
        folders.update(str(parent) for parent in path.parents if str(parent) != ".")
    names = sorted([(name, True) for name in folders] + [(name, False) for name in files])
    partial = archive.with_name(f".{archive.name}.partial")
    try:
        with (
            lzma.open(partial, "wb", format=lzma.FORMAT_XZ) as stream,
            tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name, is_folder in names:
                if is_folder:
                    tar.addfile(_member(name, tarfile.DIRTYPE, _FOLDER_MODE))
                    continue
                data = files[name].read_bytes()
                tar.addfile(_member(name, tarfile.REGTYPE, _FILE_MODE, len(data)), io.BytesIO(data))
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)


def pack_folder(folder: Path, archive: Path) -> None:
    """Pack the tree under ``folder`` into ``archive``, its members named from ``folder``'s own name (``cells/...``);
    only plain files and folders (a link or another kind of entry is refused rather than followed or skipped)."""
    files: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise FederationError(f"{path}: not a plain file or folder; refusing to pack it")
        if path.is_file():
            files[path.relative_to(folder.parent).as_posix()] = path
    pack_files(files, archive)


def unpack(archive: Path, into: Path) -> None:
    """Unpack ``archive`` into the folder ``into``; a member that is not a plain file or folder inside it is refused
    (a published archive holds nothing else)."""
    with tarfile.open(archive, mode="r:xz") as tar:
        for member in tar.getmembers():
            path = PurePosixPath(member.name)
            if not (member.isfile() or member.isdir()) or path.is_absolute() or ".." in path.parts:
                raise FederationError(f"{archive}: member {member.name!r} is not a plain file or folder inside it")
        tar.extractall(into, filter="data")


@contextmanager
def cells_folder(folder: Path) -> Iterator[Path]:
    """The folder of ``folder``'s run records: ``folder/cells`` when it is there (an ablation's own folder, or a
    published one unpacked by hand), else ``folder/cells.tar.xz`` unpacked into a temporary folder removed on exit.
    With neither, ``folder/cells`` as it is (missing: every cell reads as not run)."""
    cells = folder / CELLS_DIR
    archive = folder / CELLS_ARCHIVE
    if cells.exists() or not archive.is_file():
        yield cells
        return
    scratch = Path(tempfile.mkdtemp(prefix="gastric-fl-cells-"))
    try:
        unpack(archive, scratch)
        yield scratch / CELLS_DIR
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
