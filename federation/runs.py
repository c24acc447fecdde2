"""The run directory (``data/README.md`` section 3): files, atomic writes and per-round checkpoints.

A run is a folder other tools read while it grows (the dashboard polls it), so every file is replaced
atomically (written beside, then renamed) and ``summary.json`` says whether the run is ``running``,
``finished``, ``failed`` or ``stopped``. The server's checkpoints are safetensors of the strategy's cross-round
state (shared tensors only: a hospital's head and its own checkpoints stay in its folder,
``federation.hospital.handler``) with a JSON sidecar (round, hospitals, strategy JSON state); a checkpoint counts
only once its sidecar exists, and the sidecar is written last. Nothing is pickled.

A run directory is ``gastric-fl train``'s output (issue 10): it carries train's ownership marker from the moment it
is created (``infra.outputs.write_marker``), and ``--overwrite`` replaces only a folder with that marker holding
nothing but what a run writes (`RUN_PATTERNS`; `prepare_run_dir`). Temp files of a write killed by ``kill -9``
(hidden ``.<name>.*`` beside the file) are never read as checkpoints and are removed at the next start
(`clean_temp_files`). The process that writes a run is named by its pid *and* start time (``pid_started``), so a
pid reused by another process does not look like a live run (`is_live_run`).

Only the checkpoint functions import torch (safetensors' torch API), so that the readers of run files (`gastric-fl
report`, the dashboard) do not wait for it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from federation.errors import FederationError
from federation.jsonl import DamagedLine, scan_jsonl
from federation.run_reader import RecordError, read_summary
from federation.runfiles import (  # the run files' names
    ACCOUNTANT_FILE,
    AGGREGATION_FILE,
    ANCHORS_FILE,
    AUDIT_FILE,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    HOSPITAL_FILE,
    HOSPITAL_GLOB,
    HOSPITALS_DIR,
    METRICS_FILE,
    OUTBOUND_FILE,
    PREDICTION_COLUMNS,
    PREDICTIONS_FILE,
    PROGRESS_FILE,
    REPORT_DIR,
    REPORT_FILES,
    REPORT_HTML,
    SLIDES_DIR,
    SLIDES_FILE,
    SUMMARY_FILE,
    VAL_PREDICTIONS_FILE,
)
from infra.outputs import OutputError, atomic_target, check_replaceable, owned_by, write_atomic, write_marker
from infra.pids import same_process
from models.names import CARD_FILE, TISSUE_FILE, WEIGHTS_FILE

if TYPE_CHECKING:
    import torch

OWNER = "train"  # the command named in a run directory's ownership marker

# Everything a run directory may hold (fnmatch over relative paths, folders end with "/"): the server's files, the
# audit log, the in-process hospitals' folders, what `gastric-fl report` and `gastric-fl ablate` write into a run,
# and the hidden temp files of atomic writes (names: federation.runfiles).
_SERVER_FILES = (
    CONFIG_FILE,
    SUMMARY_FILE,
    METRICS_FILE,
    AGGREGATION_FILE,
    AUDIT_FILE,
    ANCHORS_FILE,
    PROGRESS_FILE,
)
_REPORT_FILES = REPORT_FILES
_HOSPITAL = f"{HOSPITALS_DIR}/{HOSPITAL_GLOB}"
_HOSPITAL_FILES = (
    HOSPITAL_FILE,
    PREDICTIONS_FILE,
    VAL_PREDICTIONS_FILE,
    SLIDES_FILE,
    WEIGHTS_FILE,
    CARD_FILE,
    TISSUE_FILE,
    REPORT_HTML,
    OUTBOUND_FILE,
    ACCOUNTANT_FILE,
)
RUN_PATTERNS: tuple[str, ...] = (
    *_SERVER_FILES,
    *(f".{name}.*" for name in _SERVER_FILES),
    *_REPORT_FILES,
    *(f".{name}.*" for name in _REPORT_FILES),
    f"{REPORT_DIR}/",
    *(f"{REPORT_DIR}/{name}" for name in _REPORT_FILES),
    *(f"{REPORT_DIR}/.{name}.*" for name in _REPORT_FILES),
    f"{CHECKPOINT_DIR}/",
    f"{CHECKPOINT_DIR}/round_[0-9][0-9][0-9][0-9].safetensors",
    f"{CHECKPOINT_DIR}/round_[0-9][0-9][0-9][0-9].json",
    f"{CHECKPOINT_DIR}/.round_*",
    f"{HOSPITALS_DIR}/",
    f"{_HOSPITAL}/",
    *(f"{_HOSPITAL}/{name}" for name in _HOSPITAL_FILES),
    *(f"{_HOSPITAL}/.{name}.*" for name in _HOSPITAL_FILES),
    f"{_HOSPITAL}/{CHECKPOINT_DIR}/",
    f"{_HOSPITAL}/{CHECKPOINT_DIR}/round_[0-9][0-9][0-9][0-9].safetensors",
    f"{_HOSPITAL}/{CHECKPOINT_DIR}/.round_*",
    # slides scored with the hospital's model for the dashboard's Slide page and the HTML report (app.slide_view)
    f"{_HOSPITAL}/{SLIDES_DIR}/",
    f"{_HOSPITAL}/{SLIDES_DIR}/*",
)

_STRATEGY = "strategy"


def now_iso() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/inf: map them to ``null``."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as strict JSON (no NaN)."""
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, with a clear error for a missing or damaged file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise FederationError(f"{path} does not exist: is this a run directory made by gastric-fl train?") from exc
    except json.JSONDecodeError as exc:
        raise FederationError(f"{path} is not valid JSON ({exc})") from exc
    except PermissionError as exc:  # e.g. a deployed run written by the server's user, read by another
        raise FederationError(
            f"{path} cannot be read by this user ({exc.strerror}): run the command as the user that wrote it "
            "(for a deployed run: the server's user, on the server machine), or let this user read the folder"
        ) from exc
    if not isinstance(data, dict):
        raise FederationError(f"{path} should hold a JSON object")
    return data


def append_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append one JSON line per record (each line is complete before the newline is written)."""
    text = "".join(json.dumps(dict(r), allow_nan=False) + "\n" for r in records)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()


def keep_rounds(path: Path, last_round: int) -> tuple[DamagedLine, ...]:
    """Rewrite a JSON-lines file keeping only records of rounds ``<= last_round`` (used on resume).

    Returns the damaged lines left out (by file and line number), so that the caller can say so.
    """
    scan = scan_jsonl(path)
    kept = [r for r in scan.records if int(r.get("round", 0)) <= last_round]
    atomic_write_text(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))
    return scan.damaged


def write_predictions(path: Path, rows: Iterable[Sequence[Any]], columns: Sequence[str] = PREDICTION_COLUMNS) -> None:
    """Atomically write ``predictions.csv`` with the header ``columns`` (`prediction_columns`)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


def default_run_dir(base: Path, name: str) -> Path:
    """``<base>/<name>-<UTC timestamp>``, made unique with a counter if needed."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    candidate = base / f"{name}-{stamp}"
    counter = 1
    while candidate.exists():
        counter += 1
        candidate = base / f"{name}-{stamp}-{counter}"
    return candidate


def is_live_run(run_dir: Path) -> bool:
    """True if ``summary.json`` says ``running`` and its process (pid and start time, ``pid_started``) still exists.

    A pid that now belongs to another process (the run was killed, the pid reused) is not a live run.
    """
    try:
        summary = read_summary(run_dir)
    except RecordError:
        return False
    pid = summary.data.get("pid")
    if summary.status != "running" or not isinstance(pid, int) or pid == os.getpid():
        return False
    started = summary.data.get("pid_started")
    return same_process(pid, started if isinstance(started, int) else None)


def clean_temp_files(run_dir: Path) -> list[Path]:
    """Remove the server's temp files left by a write killed mid-way (``kill -9``); returns what was removed.

    Only hidden ``.<name>.*`` files of the run's own files and checkpoints; call it while holding the run's lock.
    Hospitals clean their own folders (``federation.hospital.handler``).
    """
    found = [p for name in _SERVER_FILES for p in run_dir.glob(f".{name}.*")]
    found += list((run_dir / CHECKPOINT_DIR).glob(".round_*")) if (run_dir / CHECKPOINT_DIR).is_dir() else []
    removed = []
    for path in found:
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def prepare_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Create an empty run directory carrying train's marker.

    An existing non-empty folder is replaced only with ``overwrite``, and only if train made it and it holds
    nothing but what a run writes (`RUN_PATTERNS`); anything else is refused in one line naming the folder and
    the foreign file, and nothing is deleted. Call it while holding the run's lock (``claim_output``).
    """
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        raise FederationError(f"--out {run_dir} is not a folder; choose another --out")
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            if not owned_by(run_dir, OWNER):
                raise FederationError(
                    f"--out {run_dir} already exists and was not made by gastric-fl train: choose another --out "
                    "(a new or empty folder)"
                )
            raise FederationError(
                f"run directory {run_dir} already exists: pass --overwrite to replace it, "
                f"or --resume {run_dir} to continue it"
            )
        try:
            check_replaceable(run_dir, OWNER, patterns=RUN_PATTERNS, flag="--out")
        except OutputError as exc:
            raise FederationError(str(exc)) from None
        if is_live_run(run_dir):
            raise FederationError(f"{run_dir} belongs to a run that is still going: stop it before overwriting")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_marker(run_dir, OWNER, record_contents=False)


# -- checkpoints ---------------------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """Everything the server needs to continue after round ``round``: which hospitals, the strategy's state, and
    (``pending``) the round's record while its evaluation is still to come (`federation.server.rounds`)."""

    round: int
    hospitals: list[int]
    strategy_tensors: dict[str, torch.Tensor]
    strategy_json: dict[str, Any]
    pending: dict[str, Any] | None = None


def _checkpoint_paths(run_dir: Path, server_round: int) -> tuple[Path, Path]:
    folder = run_dir / CHECKPOINT_DIR
    stem = f"round_{server_round:04d}"
    return folder / f"{stem}.safetensors", folder / f"{stem}.json"


def write_checkpoint(run_dir: Path, checkpoint: Checkpoint, keep: int) -> None:
    """Write round ``checkpoint.round`` (tensors first, sidecar last), then drop all but the last ``keep``."""
    from safetensors.torch import save_file  # torch, only where tensors are written: readers of run files skip it

    tensors_path, sidecar_path = _checkpoint_paths(run_dir, checkpoint.round)
    tensors: dict[str, torch.Tensor] = {}
    for key, value in checkpoint.strategy_tensors.items():
        tensors[f"{_STRATEGY}/{key}"] = value.detach().cpu().contiguous()
    from safetensors import SafetensorError

    try:
        tensors_path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_target(tensors_path) as tmp:
            save_file(tensors, str(tmp), metadata={"round": str(checkpoint.round)})
            digest = file_sha256(tmp)
        write_json(
            sidecar_path,
            {
                "round": checkpoint.round,
                "sha256": digest,  # of the tensors file: a resume refuses one that no longer hashes to it
                "clients": sorted(checkpoint.hospitals),
                "strategy": checkpoint.strategy_json,
                **({} if checkpoint.pending is None else {"pending": checkpoint.pending}),
                "written_at": now_iso(),
            },
        )
    except SafetensorError as exc:  # safetensors' own error for a failed write (a full disk): not an OSError
        reason = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FederationError(
            f"the server cannot write its checkpoint of round {checkpoint.round} in {tensors_path.parent} ({reason}); "
            "free space there, then continue with --resume"
        ) from exc
    for old in complete_checkpoints(run_dir)[:-keep]:
        for path in _checkpoint_paths(run_dir, old)[::-1]:  # sidecar first: the checkpoint stops counting
            path.unlink(missing_ok=True)


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Rounds with a complete checkpoint (tensors and sidecar present), ascending; hidden temp files never count."""
    folder = run_dir / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    rounds: list[int] = []
    for sidecar in folder.glob("round_*.json"):
        try:
            server_round = int(sidecar.stem.removeprefix("round_"))
        except ValueError:
            continue
        if _checkpoint_paths(run_dir, server_round)[0].is_file():
            rounds.append(server_round)
    return sorted(rounds)


def drop_checkpoint(run_dir: Path, server_round: int) -> None:
    """Remove round ``server_round``'s checkpoint (sidecar first, so that it stops counting at once)."""
    for path in _checkpoint_paths(run_dir, server_round)[::-1]:
        path.unlink(missing_ok=True)


class CheckpointChanged(FederationError):
    """A checkpoint whose tensors file no longer hashes to the sha256 its sidecar recorded: it was changed after it
    was written (a flipped byte loads silently), so a resume stops rather than fall back or use it."""


def file_sha256(path: Path) -> str:
    """sha256 of the file at ``path`` (``hashlib.file_digest``)."""
    import hashlib

    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def read_checkpoint(run_dir: Path, server_round: int, warn: Callable[[str], None] | None = None) -> Checkpoint:
    """Load round ``server_round``'s checkpoint, checked against the sha256 its sidecar recorded: a file that does not
    read is a `FederationError` (a resume falls back to the round before), one that reads but hashes otherwise is
    `CheckpointChanged` (a resume stops); a sidecar written before the hash was kept: loaded unchecked, said through
    ``warn``."""
    from safetensors.torch import load_file

    tensors_path, sidecar_path = _checkpoint_paths(run_dir, server_round)
    sidecar = read_json(sidecar_path)
    try:
        tensors = load_file(str(tensors_path))
        now = file_sha256(tensors_path)
    except Exception as exc:  # cut short, zeroed, gone: unreadable (the resume falls back to the round before)
        raise FederationError(f"checkpoint {tensors_path} cannot be read ({exc})") from exc
    recorded = sidecar.get("sha256")
    if isinstance(recorded, str) and recorded != now:  # it reads, but it is not what was written
        raise CheckpointChanged(
            f"checkpoint {tensors_path} does not hash to the sha256 {sidecar_path.name} recorded when it was written "
            f"({recorded[:12]}... then, {now[:12]}... now): it changed since, so the run cannot continue from it; "
            f"restore it from a backup, or remove it and {sidecar_path.name} to continue from the round before"
        )
    if recorded is None and warn is not None:
        warn(f"checkpoint {tensors_path} was written without its sha256 (an earlier version): loaded unchecked")
    hospitals = [int(c) for c in sidecar.get("clients", [])]
    strategy: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        kind, _, rest = name.partition("/")
        if kind == _STRATEGY:
            strategy[rest] = value
    pending = sidecar.get("pending")
    return Checkpoint(
        server_round,
        hospitals,
        strategy,
        dict(sidecar.get("strategy", {})),
        pending if isinstance(pending, dict) else None,
    )
