"""Output folders a command owns: an ownership marker, one lock per folder, paths confined to a folder.

A leaf module (standard library only, no torch, nothing of ours), so that ``pipeline`` and ``federation`` share one
mechanism for each of these questions instead of answering them case by case (issue 10):

* **Is this folder ours to replace?** A command that creates an output folder writes ``.gastric-fl-owner.json``
  (`MARKER_NAME`) into it, naming the command and the paths it wrote (`write_marker`). Before it replaces or
  deletes such a folder it calls `check_replaceable`: a folder without the marker, with another command's
  marker, or holding anything the command did not write (a file listed neither in the marker nor matching the
  command's own patterns) is refused with one line naming the folder and the foreign file. A missing or
  empty folder is always fine.
* **Is someone else writing it?** `claim_output(folder, command)` is a context manager holding an exclusive
  ``flock`` on a lock file *beside* the folder (``<parent>/.<name>.lock``, so it survives the folder being
  renamed into place). A second writer is refused at once with one line naming the folder and the pid
  holding it. The kernel drops a ``flock`` when its process dies (even by ``kill -9``), so a stale lock file
  left by a dead process is simply taken over; the pid written in it is only for the message.
* **Does this path stay inside the folder?** `confine(root, relative)` (or `FolderPaths` for many) resolves a
  path read from a file (a manifest row) and refuses absolute paths, ``..`` components and symlinks that lead
  out of ``root``.

Also `write_atomic`, which replaces a file so that a reader sees the old or the new one, never half of one;
`replace_folder`, the same for a whole folder (written in a hidden sibling, swapped into place, the old one back
if the swap fails), with `recover_folder` for what a killed run left beside it;
`os_error_message`: an ``OSError`` met while writing an output (a file where a folder should be, a read-only file
system, a full disk) as one line saying what to do; and `terminate_as_interrupt`, which makes SIGTERM/SIGHUP
unwind the stack like Ctrl-C so that ``finally`` blocks remove half-written outputs.

Errors meant for the user are `OutputError` (``user_facing = True``: the CLI prints one line and exits 2).
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from types import FrameType
from typing import Any

MARKER_NAME = ".gastric-fl-owner.json"
MARKER_VERSION = 1
LOCK_SUFFIX = ".lock"


class OutputError(ValueError):
    """An output folder that must not be written or replaced; the CLI prints it as one line and exits 2."""

    user_facing = True


class PathOutsideError(ValueError):
    """A relative path that leaves its folder; callers add the file and line it came from."""


# --- ownership marker -------------------------------------------------------------------------------------------


def _entries(folder: Path) -> list[str]:
    """Every file, folder and link under ``folder`` (relative, forward slashes, sorted), links not followed."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        base = Path(dirpath).relative_to(folder)
        for name in dirnames:
            found.append((base / name).as_posix() + "/")
        for name in filenames:
            found.append((base / name).as_posix())
    return sorted(found)


def write_marker(folder: Path, command: str, *, complete: bool = True, record_contents: bool = True) -> Path:
    """Write ``folder/.gastric-fl-owner.json`` naming ``command`` (and, by default, everything now in ``folder``).

    Call it last, once the folder holds what the command wrote (``record_contents``), or first with
    ``record_contents=False`` for a folder whose contents grow over time (a run directory): the command's
    ``patterns`` given to `check_replaceable` then say what it may hold. ``complete=False`` marks a temporary
    folder that is not yet a finished output (a staging folder).
    """
    record: dict[str, Any] = {"command": command, "marker_version": MARKER_VERSION, "complete": complete}
    if record_contents:
        record["paths"] = [p for p in _entries(folder) if p != MARKER_NAME]
    path = folder / MARKER_NAME
    write_atomic(path, (json.dumps(record, indent=1) + "\n").encode("utf-8"))
    return path


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of ``folder`` as a dict, or ``None`` when it has none (or an unreadable one)."""
    path = folder / MARKER_NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("command"), str) else None


def owned_by(folder: Path, command: str) -> bool:
    """Whether ``folder`` carries a readable marker written by ``command``."""
    marker = read_marker(folder)
    return marker is not None and marker["command"] == command


def foreign_entries(folder: Path, command: str, patterns: Sequence[str] = ()) -> list[str]:
    """What in ``folder`` ``command`` did not write: paths neither in its marker nor matching ``patterns``.

    ``patterns`` are ``fnmatch`` patterns over relative paths (folders end with ``/``), e.g. ``"checkpoints/*"``.
    A folder is judged by its contents: only an empty folder that is neither listed nor matched is foreign.
    """
    marker = read_marker(folder) or {}
    listed = set(marker.get("paths", [])) if marker.get("command") == command else set()
    entries = [e for e in _entries(folder) if e not in (MARKER_NAME, f"{MARKER_NAME}.tmp")]

    def accepted(entry: str) -> bool:
        return entry in listed or any(fnmatch.fnmatchcase(entry, p) for p in patterns)

    non_empty = {PurePosixPath(e.rstrip("/")).parent.as_posix() + "/" for e in entries}
    foreign = []
    for entry in entries:
        if accepted(entry):
            continue
        # A folder is judged by what it holds; only an empty folder nobody listed is foreign in itself.
        if entry.endswith("/") and entry in non_empty:
            continue
        foreign.append(entry)
    return foreign


def remove_entries(folder: Path, names: Iterable[str]) -> None:
    """Remove ``folder / name`` for each of ``names``, the entries a command owns there: a folder with what it
    holds, a file or a link itself (never what a link points to); absent ones are skipped. Nothing else in
    ``folder`` is touched."""
    for name in names:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def check_addable(folder: Path, command: str, *, what: str = "", flag: str = "--out") -> None:
    """Refuse (`OutputError`) a folder ``command`` would add its files to unless it is new, empty or ``command``'s
    own (its marker): the check of the commands that add to and replace only their own files in ``--out``
    (``report --html``, ``predict``). ``what`` names the command in the message (default ``command``)."""
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{flag} {folder} is not a folder; choose another {flag}")
    if folder.is_dir() and any(folder.iterdir()) and not owned_by(folder, command):
        raise OutputError(
            f"{flag} {folder} holds files gastric-fl {command} did not write; choose a new or empty folder "
            f"({what or command} adds to and replaces only its own files)"
        )


def check_replaceable(folder: Path, command: str, *, patterns: Sequence[str] = (), flag: str = "--out") -> None:
    """Refuse (`OutputError`) to replace ``folder`` unless ``command`` wrote it and everything in it.

    A missing folder or an empty one is fine. Refused, each with one line naming the folder (and the first
    foreign entry): a file where the folder should be, a folder without ``command``'s marker (made by hand,
    by another command, or by a version before markers), and a folder holding anything ``command`` did not
    write. ``flag`` names the option the user should change in the message.
    """
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_symlink() or not folder.is_dir():
        raise OutputError(f"{flag} {folder} is not a folder; choose another {flag}")
    if not any(folder.iterdir()):
        return
    marker = read_marker(folder)
    if marker is None or marker["command"] != command:
        made_by = "" if marker is None else f" (it was made by gastric-fl {marker['command']})"
        raise OutputError(
            f"{flag} {folder} was not made by gastric-fl {command} (no {MARKER_NAME}){made_by}; refusing to replace "
            f"it: choose another {flag}, or delete the folder yourself if nothing in it is needed"
        )
    foreign = foreign_entries(folder, command, patterns)
    if foreign:
        raise OutputError(
            f"{flag} {folder} holds {folder / foreign[0].rstrip('/')}, which gastric-fl {command} did not write "
            f"({len(foreign)} such entr{'y' if len(foreign) == 1 else 'ies'}); refusing to replace it: move them "
            f"out or choose another {flag}"
        )


# --- one writer per folder ----------------------------------------------------------------------------------------


def lock_path(folder: Path) -> Path:
    """The lock file of ``folder``: ``<parent>/.<name>.lock`` (beside it, so renaming the folder keeps the lock)."""
    return folder.parent / f".{folder.name}{LOCK_SUFFIX}"


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"gastric-fl {info.get('command', '?')} (pid {int(info['pid'])})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@contextmanager
def claim_output(folder: Path, command: str, *, flag: str = "--out") -> Iterator[Path]:
    """Hold the exclusive lock of ``folder`` for ``command`` while the block runs; yields the lock file's path.

    A second claim (another process, or another thread of this one) fails at once with `OutputError` naming
    the folder and the pid holding it. A lock file left by a dead process holds no ``flock`` and is taken
    over. The parent folder is created if needed (and removed again at the end if it is still empty); an
    ``OSError`` doing so becomes `OutputError` (`os_error_message`). The lock file is removed when the block ends.
    """
    path = lock_path(folder)
    created = [p for p in [folder.parent, *folder.parent.parents] if not p.exists() and not p.is_symlink()]
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(os_error_message(exc, folder, flag)) from None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise OutputError(os_error_message(exc, folder, flag)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(
                f"{flag} {folder} is being written by {_holder(path)}; wait for it to finish, stop it, "
                f"or choose another {flag}"
            ) from None
        except OSError:
            os.close(fd)
            raise
        # The previous holder may have removed the file between our open and our flock: then we locked an
        # orphan inode that a third process would not see; start again on the file now at ``path``.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        payload = json.dumps({"command": command, "pid": os.getpid(), "folder": str(folder)}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, payload, 0)
        yield path
    finally:
        with suppress(OSError):
            os.unlink(path)
        os.close(fd)  # closing drops the flock
        for parent in created:  # deepest first; a folder that now holds anything stays
            try:
                parent.rmdir()
            except OSError:
                break


# --- paths from files ------------------------------------------------------------------------------------------


class FolderPaths:
    """Paths read from a file (a manifest's rows), each confined to ``root``; see `confine`.

    One instance per file read: the folders it has resolved are remembered, so a manifest of many tiles in a
    few folders costs a few ``realpath`` calls, not one per row.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._base = root.resolve()
        self._folders: dict[Path, Path] = {}

    def __call__(self, relative: str) -> Path:
        """``root / relative`` if it stays inside ``root``; otherwise `PathOutsideError` saying why."""
        if not relative or not relative.strip():
            raise PathOutsideError("empty path")
        windows = PureWindowsPath(relative)
        if PurePosixPath(relative).is_absolute() or windows.is_absolute() or windows.drive:
            raise PathOutsideError(f"absolute path {relative!r}; paths must be relative to the dataset folder")
        if ".." in windows.parts:  # splits on both / and \
            raise PathOutsideError(f"path {relative!r} goes up with '..'; paths must stay inside the dataset folder")
        candidate = self.root / relative
        folder = self._folders.get(candidate.parent)
        if folder is None:
            folder = self._folders[candidate.parent] = candidate.parent.resolve()  # follows the links that exist
        resolved = candidate.resolve() if candidate.is_symlink() else folder / candidate.name
        if resolved != self._base and self._base not in resolved.parents:
            raise PathOutsideError(f"path {relative!r} leads outside the dataset folder (to {resolved}) through a link")
        return candidate


def confine(root: Path, relative: str) -> Path:
    """``root / relative``, checked to stay inside ``root`` (raises `PathOutsideError` saying why not).

    Refused: an empty path, an absolute path (POSIX or Windows, ``C:\\`` or ``\\\\server``), any ``..``
    component, and a path whose symlinks (in ``root`` or below) lead outside ``root``. A path that does not
    exist yet is checked as far as it exists. For many paths under one root use `FolderPaths`.
    """
    return FolderPaths(root)(relative)


# --- faults while writing --------------------------------------------------------------------------------------

_HINTS = {
    errno.ENOSPC: "the disk is full: free some space or choose another {flag}",
    errno.EDQUOT: "the disk quota is exhausted: free some space or choose another {flag}",
    errno.EROFS: "the file system is read-only: choose a writable {flag}",
    errno.EACCES: "permission denied: choose a folder you can write to as {flag}",
    errno.EPERM: "permission denied: choose a folder you can write to as {flag}",
    errno.ENOTDIR: "a part of the path is a file, not a folder: choose another {flag}",
    errno.EEXIST: "a part of the path is a file, not a folder: choose another {flag}",
    errno.ENAMETOOLONG: "the path is too long: choose a shorter {flag}",
}


@contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """The one way this project replaces a file: the block writes a new, empty temporary file beside ``path``
    (``.<name>.<random>.tmp``, hidden, so a run's ``.<name>.*`` patterns and temp-file clean-up know it) and
    ``path`` is replaced by it when the block ends; on any error (or interruption) the temporary file is removed
    and ``path`` is untouched, so a reader sees the old file or the new one, never half of one."""
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload`` (`atomic_target`)."""
    with atomic_target(path) as tmp:
        tmp.write_bytes(payload)


# --- replacing a whole folder ------------------------------------------------------------------------------------

PARTIAL_TAG = ".partial-"  # ``.<name>.partial-<random>``: the new content while it is being written
BACKUP_TAG = ".old-"  # ``.<name>.old-<random>``: the previous content during the swap


def _hidden_sibling(target: Path, tag: str) -> Path:
    """An unused hidden name beside ``target``: ``.<name><tag><random>``."""
    while True:
        candidate = target.parent / f".{target.name}{tag}{secrets.token_hex(4)}"
        if not os.path.lexists(candidate):
            return candidate


def _refuse_non_folder(target: Path) -> None:
    """`OutputError` when something other than a real folder (a file, a link) is at ``target``."""
    if os.path.lexists(target) and (target.is_symlink() or not target.is_dir()):
        raise OutputError(f"{target} is not a folder (a file or a link is never replaced); choose another place")


def _fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (best effort: some file systems cannot fsync a folder)."""
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass
class _Undo:
    """What `_swap` has started to move, recorded before each step so that `_undo` can put it back."""

    backup: Path | None = None  # where the previous folder is (being) parked
    carried: list[str] = field(default_factory=list)  # kept entries (being) moved from the old folder to the new


def _swap(tmp: Path, target: Path, keep: Callable[[str], bool] | None, undo: _Undo) -> None:
    """Put ``tmp`` at ``target``, moving the previous folder (and what ``keep`` names out of it) first."""
    if os.path.lexists(target):
        _refuse_non_folder(target)
        if keep is not None:
            names = sorted(name for name in os.listdir(target) if keep(name))
            clash = [name for name in names if os.path.lexists(tmp / name)]
            if clash:
                raise OutputError(
                    f"{target} holds {target / clash[0]}, which the new content also writes; refusing to replace "
                    "it: move it out first"
                )
            undo.carried = names  # from here on, any of these found in ``tmp`` came from ``target``
            for name in names:
                os.rename(target / name, tmp / name)
        undo.backup = _hidden_sibling(target, BACKUP_TAG)
        os.rename(target, undo.backup)
    os.rename(tmp, target)


def _undo(tmp: Path, target: Path, undo: _Undo) -> None:
    """After a failure or an interruption: the old folder back at ``target`` with what was carried out of it,
    ``tmp`` removed. Decided from what is on disk, so it is right wherever `_swap` stopped."""
    backup = undo.backup
    if not os.path.lexists(tmp):  # the final rename happened: the new content is complete and in place
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
        return
    problem = ""
    if backup is not None and os.path.lexists(backup) and not os.path.lexists(target):
        try:
            os.rename(backup, target)
        except OSError as exc:
            problem = f"the previous {target} is at {backup} ({exc.strerror or exc}): rename it back"
    stranded = []
    for name in undo.carried:
        if not os.path.lexists(tmp / name):
            continue
        if not problem and not os.path.lexists(target / name):
            try:
                os.rename(tmp / name, target / name)
                continue
            except OSError:
                pass
        stranded.append(name)
    if stranded:  # never delete what the command did not write: leave them where they are and say so
        problem = "; ".join(filter(None, [problem, f"{', '.join(stranded)} are in {tmp}: move them back to {target}"]))
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if problem:
        raise OutputError(f"replacing {target} failed and could not be undone: {problem}")


@contextmanager
def replace_folder(target: Path, *, keep: Callable[[str], bool] | None = None, mode: int = 0o777) -> Iterator[Path]:
    """The one way this project replaces a whole folder (the folder analogue of `atomic_target`).

    The block writes the new content into a fresh hidden sibling folder (``.<name>.partial-<random>``, created
    with ``mode`` as ``os.mkdir`` does, so the umask applies); when the block ends it is swapped into place:
    an existing ``target`` is renamed to a hidden backup sibling (``.<name>.old-<random>``), the new folder is
    renamed to ``target``, the parent folder is fsynced and the backup removed. If the final rename fails, the
    backup is renamed back, so the old content is intact. On any failure or interruption (an exception, Ctrl-C,
    SIGTERM under `terminate_as_interrupt`) the temporary folder is removed and ``target`` is as it was: a reader
    sees the old folder or the new one, never half of one, and nothing half-written is left beside it.

    ``keep`` (a test on the names at the top of the old folder) names entries that are not the command's and
    must survive the replacement (a user's notes beside a kit): they are moved into the new folder just before
    the swap, and back if it fails; a kept name the new content also holds is refused (`OutputError`).

    What ``target`` may hold is the caller's question (`check_replaceable`, its own marker): check it before,
    and again as the block's last step if files may have appeared meanwhile; hold `claim_output` around it so
    that no one else writes there. A file or a link at ``target`` is refused (`OutputError`), before and at the
    swap. The parent folder must exist. An ``OSError`` is raised unchanged, for the caller's one-line message.
    A run killed outright (``kill -9``, power loss) can leave the hidden folders; `recover_folder` tidies them
    for commands that mark their folders. See docs/design.md, "Data flow and the formats between stages".
    """
    _refuse_non_folder(target)
    while True:
        tmp = _hidden_sibling(target, PARTIAL_TAG)
        try:
            os.mkdir(tmp, mode)
            break
        except FileExistsError:  # made by someone else since the name was drawn: draw another
            continue
    undo = _Undo()
    try:
        yield tmp
        _swap(tmp, target, keep, undo)
    except BaseException:
        _undo(tmp, target, undo)
        raise
    _fsync_folder(target.parent)
    if undo.backup is not None:
        shutil.rmtree(undo.backup, ignore_errors=True)  # the new content is in place; the old is no longer needed


def recover_folder(target: Path, command: str) -> None:
    """Tidy what a killed `replace_folder` (``kill -9``, power loss) of ``command`` left beside ``target``.

    Call it holding ``target``'s lock (`claim_output`). Only folders carrying ``command``'s marker are touched
    (so the command marks its temporary folder first: ``write_marker(tmp, command, complete=False,
    record_contents=False)``): hidden ``.<name>.partial-*`` folders are removed; a previous folder parked as
    ``.<name>.old-*`` is put back when ``target`` is missing, and removed otherwise. Anything else stays.
    """
    if not target.parent.is_dir():
        return
    siblings = sorted(target.parent.iterdir())
    for tag in (PARTIAL_TAG, BACKUP_TAG):
        for path in siblings:
            if not path.name.startswith(f".{target.name}{tag}") or path.is_symlink() or not path.is_dir():
                continue
            if not owned_by(path, command):
                continue
            if tag == BACKUP_TAG and not os.path.lexists(target):
                os.rename(path, target)
            else:
                shutil.rmtree(path, ignore_errors=True)


def os_error_message(exc: OSError, folder: Path, flag: str = "--out") -> str:
    """One line for an ``OSError`` met while writing ``folder``: which path, what happened, what to do."""
    where = exc.filename if exc.filename is not None else folder
    hint = _HINTS.get(exc.errno or 0, "choose another {flag} or fix the folder").format(flag=flag)
    reason = exc.strerror or type(exc).__name__
    return f"cannot write {flag} {folder}: {where}: {reason}; {hint}"


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP received: raised in the main thread so that cleanup code runs, as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")


@contextmanager
def terminate_as_interrupt(
    signals: Iterable[int] = (signal.SIGTERM, signal.SIGHUP), *, take_over: bool = False
) -> Iterator[None]:
    """While the block runs, SIGTERM/SIGHUP raise `Terminated` (a ``KeyboardInterrupt``) instead of killing.

    The default action of SIGTERM ends the process without running ``finally`` blocks, which left hidden
    half-written folders (and, in a deployment, running Flower processes) behind. The first signal raises;
    further ones are ignored while cleanup runs (a ``kill -9`` still works). Only signals still at their default
    action are taken over: a caller's own handler (e.g. the training engine's) or an ignored SIGHUP (``nohup``)
    keeps working, and nested blocks leave the outer one in charge; ``take_over`` takes the signals whatever their
    handler (the round loop, which must mark its run stopped even inside a host that handles SIGTERM itself). Only
    possible in the main thread; elsewhere this does nothing. The previous handlers are restored afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if received:
            return
        received.append(signum)
        raise Terminated(signum)

    previous = {s: signal.getsignal(s) for s in signals}
    taken = [s for s, old in previous.items() if take_over or old == signal.SIG_DFL]
    for s in taken:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s in taken:
            signal.signal(s, previous[s])
