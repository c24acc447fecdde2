"""The run directory (``data/README.md`` section 3): files, atomic writes and per-round checkpoints.

A run is a folder other tools read while it grows (the dashboard polls it), so every file is replaced
atomically (written beside, then renamed) and ``summary.json`` says whether the run is ``running``,
``finished``, ``failed`` or ``stopped``. The server's checkpoints are safetensors of the strategy's cross-round
state (shared tensors only: a hospital's head and its own checkpoints stay in its folder,
``federation.engine.hospital``) with a JSON sidecar (round, hospitals, strategy JSON state); a checkpoint counts
only once its sidecar exists, and the sidecar is written last. Nothing is pickled.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from federation.contract import TensorDict
from federation.errors import FederationError
from federation.jsonl import read_jsonl
from federation.processes import pid_alive

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
AGGREGATION_FILE = "aggregation.jsonl"
SUMMARY_FILE = "summary.json"
PREDICTIONS_FILE = "predictions.csv"  # in each hospital's folder (federation.engine.hospital)
CHECKPOINT_DIR = "checkpoints"
PREDICTION_COLUMNS = ("client", "path", "label", "prob_abnormal", "round")

_STRATEGY = "strategy"


def now_iso() -> str:
    """The current UTC time, ISO 8601 with seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/inf: map them to ``null``."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _atomic_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half of one."""
    _atomic_bytes(path, text.encode("utf-8"))


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
    if not isinstance(data, dict):
        raise FederationError(f"{path} should hold a JSON object")
    return data


def append_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append one JSON line per record (each line is complete before the newline is written)."""
    text = "".join(json.dumps(dict(r), allow_nan=False) + "\n" for r in records)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()


def keep_rounds(path: Path, last_round: int) -> None:
    """Rewrite a JSON-lines file keeping only records of rounds ``<= last_round`` (used on resume)."""
    kept = [r for r in read_jsonl(path) if int(r.get("round", 0)) <= last_round]
    atomic_write_text(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))


def write_predictions(path: Path, rows: Iterable[Sequence[Any]]) -> None:
    """Atomically write ``predictions.csv`` (``PREDICTION_COLUMNS``)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(PREDICTION_COLUMNS)
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
    """True if ``summary.json`` says ``running`` and its process still exists."""
    summary = run_dir / SUMMARY_FILE
    if not summary.is_file():
        return False
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    pid = data.get("pid")
    return data.get("status") == "running" and isinstance(pid, int) and pid != os.getpid() and pid_alive(pid)


def prepare_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Create an empty run directory; an existing one is replaced only with ``overwrite`` and only if it is a run."""
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise FederationError(
                f"run directory {run_dir} already exists: pass --overwrite to replace it, "
                f"or --resume {run_dir} to continue it"
            )
        if not ((run_dir / CONFIG_FILE).is_file() or (run_dir / SUMMARY_FILE).is_file()):
            raise FederationError(
                f"{run_dir} is not a run directory (no config.toml or summary.json): refusing to delete it"
            )
        if is_live_run(run_dir):
            raise FederationError(f"{run_dir} belongs to a run that is still going: stop it before overwriting")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


# -- checkpoints ---------------------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """Everything the server needs to continue after round ``round``: which hospitals, the strategy's state."""

    round: int
    clients: list[int]
    strategy_tensors: TensorDict
    strategy_json: dict[str, Any]


def _checkpoint_paths(run_dir: Path, server_round: int) -> tuple[Path, Path]:
    folder = run_dir / CHECKPOINT_DIR
    stem = f"round_{server_round:04d}"
    return folder / f"{stem}.safetensors", folder / f"{stem}.json"


def write_checkpoint(run_dir: Path, checkpoint: Checkpoint, keep: int) -> None:
    """Write round ``checkpoint.round`` (tensors first, sidecar last), then drop all but the last ``keep``."""
    tensors_path, sidecar_path = _checkpoint_paths(run_dir, checkpoint.round)
    tensors: dict[str, torch.Tensor] = {}
    for key, value in checkpoint.strategy_tensors.items():
        tensors[f"{_STRATEGY}/{key}"] = value.detach().cpu().contiguous()
    tensors_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{tensors_path.name}.", dir=tensors_path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"round": str(checkpoint.round)})
        os.replace(tmp, tensors_path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    write_json(
        sidecar_path,
        {
            "round": checkpoint.round,
            "clients": sorted(checkpoint.clients),
            "strategy": checkpoint.strategy_json,
            "written_at": now_iso(),
        },
    )
    for old in complete_checkpoints(run_dir)[:-keep]:
        for path in _checkpoint_paths(run_dir, old)[::-1]:  # sidecar first: the checkpoint stops counting
            path.unlink(missing_ok=True)


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Rounds with a complete checkpoint (tensors and sidecar present), ascending."""
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


def read_checkpoint(run_dir: Path, server_round: int) -> Checkpoint:
    """Load round ``server_round``'s checkpoint."""
    tensors_path, sidecar_path = _checkpoint_paths(run_dir, server_round)
    sidecar = read_json(sidecar_path)
    try:
        tensors = load_file(str(tensors_path))
    except Exception as exc:
        raise FederationError(
            f"checkpoint {tensors_path} cannot be read ({exc}): delete it to resume from an earlier one"
        ) from exc
    clients = [int(c) for c in sidecar.get("clients", [])]
    strategy: TensorDict = {}
    for name, value in tensors.items():
        kind, _, rest = name.partition("/")
        if kind == _STRATEGY:
            strategy[rest] = value
    return Checkpoint(server_round, clients, strategy, dict(sidecar.get("strategy", {})))
