"""Reading the JSON records the stages leave behind, with one error type that says what is wrong with a file.

- `RecordError`: a record file that cannot be used, with its ``kind`` and ``path``: ``"missing"`` (no such
  file), ``"unreadable"`` (it cannot be read in its format: the file system refuses, it is not UTF-8, it is not
  JSON, TOML or CSV), ``"malformed"`` (it parses, but does not hold what the record holds: not a JSON object, a
  column or value that is wrong) or ``"other_task"`` (a hospital's predictions of another task than the reader's).
  Every reader of a run directory (`federation.run_reader`, `federation.runfiles`) and of ``prepare.json``
  raises it; each command, report or page words it for its reader and says what to do.
- `read_json_object`: one JSON object file (a run's ``summary.json``, a model card, ``prepare.json``).
- `PrepareRecord` and `read_prepare_record`: the prepared dataset's record, ``prepare.json``
  (`infra.formats.PREPARE_RECORD`), written by ``pipeline.prepare`` and read by the federation (a dataset's class
  list, its hospitals' groups) and by the application (the Data page, the verdict's shortcut warning). It lives
  here because ``pipeline`` and ``federation`` may not import each other (docs/design.md, "Layout and layers").

Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from infra.formats import PREPARE_RECORD

RecordKind = Literal["missing", "unreadable", "malformed", "other_task"]


class RecordError(ValueError):
    """A record file that cannot be used: the message names the file and what is wrong; ``kind`` says which
    (module docstring), ``path`` the file, ``cause`` the error it was read with (``None`` when it read but holds
    the wrong thing). A command prints it as one line and exits 2 (``user_facing``)."""

    user_facing = True

    def __init__(self, message: str, *, kind: RecordKind, path: Path, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.kind: RecordKind = kind
        self.path = path
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        # An error raised in a worker process is pickled to its parent: rebuilt from the message, kind and path
        # (the keyword arguments would otherwise be lost; the cause stays behind, it may not pickle).
        return (_rebuild, (str(self), self.kind, self.path))

    @property
    def damaged(self) -> bool:
        """Whether the file is there, for this task, and cannot be used (rewriting it is the remedy)."""
        return self.kind in ("unreadable", "malformed")


def _rebuild(message: str, kind: RecordKind, path: Path) -> RecordError:
    return RecordError(message, kind=kind, path=path)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object ``path`` holds; `RecordError` for a missing file (``missing``), one that cannot be read or is
    not JSON (``unreadable``: ``"<path> is not readable JSON (<why>)"``) or JSON that is not an object
    (``malformed``: ``"<path> holds no JSON object"``)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise RecordError(f"{path} does not exist", kind="missing", path=path, cause=exc) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path} is not readable JSON ({exc})", kind="unreadable", path=path, cause=exc) from None
    if not isinstance(value, dict):
        raise RecordError(f"{path} holds no JSON object", kind="malformed", path=path)
    return value


@dataclass(frozen=True)
class PrepareRecord:
    """A prepared dataset's ``prepare.json``: ``path`` (the file) and ``data`` (the object as written; the Data page
    shows all of it), with the fields the other stages read. The values are as ``prepare`` wrote them; the reader
    that uses a field checks it (``federation.hospital.data.prepared_classes`` the class list,
    ``federation.amp_groups.run_groups`` the groups)."""

    path: Path
    data: Mapping[str, Any]

    @property
    def classes(self) -> object:
        """``classes``: the class names in class-index order (``None`` in a record older than class lists)."""
        return self.data.get("classes")

    @property
    def hospitals(self) -> object:
        """prepare.json's ``clients``: one entry per hospital (``client``, ``site``, ``group``, ...), as prepare
        wrote them."""
        return self.data.get("clients")

    @property
    def shortcut_probe(self) -> object:
        """``shortcut_probe``: prepare's label-free pixel-statistics probe (``pipeline.probe``; ``None`` before it
        was measured)."""
        return self.data.get("shortcut_probe")


def read_prepare_record(dataset: Path) -> PrepareRecord:
    """``<dataset>/prepare.json`` as a `PrepareRecord`; `RecordError` (`read_json_object`'s kinds) when it is
    missing, unreadable or not a JSON object."""
    path = Path(dataset) / PREPARE_RECORD
    return PrepareRecord(path, read_json_object(path))
