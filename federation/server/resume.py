"""Continuing a run from its last complete checkpoint (``gastric-fl train --resume``; docs/reliability.md).

Before the run starts (``open_for_resume``): a run still running is refused, temp files of a killed write are
removed, and a run that continues (it has a complete checkpoint; otherwise it restarts at round 1 with whatever
settings were corrected) must find the dataset's manifest as it was (``dataset_sha256``). Once the hospitals have
answered and the strategy is built (``continue_run``): the newest readable checkpoint (``resume_checkpoint``: a
damaged line of ``metrics.jsonl``/``aggregation.jsonl`` is named and its round redone, a checkpoint that cannot be read
gives way to the previous one) loads the strategy's state, the run files are cut back to its round, and a round whose
evaluation had not come back (``Checkpoint.pending``) waits for it again, so a resumed run ends with the same files as
one that never stopped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.jsonl import DamagedLine, read_jsonl, scan_jsonl
from federation.runfiles import AGGREGATION_FILE, CHECKPOINT_DIR, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from federation.runs import (
    OWNER,
    Checkpoint,
    CheckpointChanged,
    clean_temp_files,
    complete_checkpoints,
    drop_checkpoint,
    is_live_run,
    keep_rounds,
    read_checkpoint,
)
from federation.server.rounds import RoundRecord
from federation.summary_errors import read_summary_object
from federation.wire.contract import Strategy
from infra.formats import MANIFEST_FILE
from infra.outputs import owned_by, write_marker

Warn = Callable[[str], None]


def open_for_resume(run_dir: Path, dataset: str, dataset_sha256: str | None, warn: Warn) -> tuple[dict[str, Any], bool]:
    """Check that ``run_dir`` may be resumed and tidy it: its ``summary.json`` as it was, and whether the run
    restarts at round 1 (no complete checkpoint). ``dataset``: the run's ``data.path``; ``dataset_sha256``: its
    manifest's hash now (``None``: the hospitals are elsewhere and check it themselves)."""
    previous = read_summary_object(run_dir)
    if is_live_run(run_dir):
        raise FederationError(f"{run_dir} is still running (pid {previous['pid']}): stop it first")
    for path in clean_temp_files(run_dir):
        warn(f"removed {path}, left by an interrupted write")
    # No complete round to continue from: the run starts again at round 1 in the same folder (with whatever
    # settings were corrected), so the dataset may have changed too.
    done = complete_checkpoints(run_dir)
    restart = not done
    recorded_rounds = previous.get("rounds_done")
    if isinstance(recorded_rounds, int) and recorded_rounds > (done[-1] if done else 0):
        named = ", ".join(f"round_{r:04d}" for r in range(max(done, default=0) + 1, recorded_rounds + 1))
        if restart:  # continuing would start again at round 1 without a word: say what is gone, and stop
            raise FederationError(
                f"{run_dir / CHECKPOINT_DIR} holds no complete checkpoint, but {run_dir / SUMMARY_FILE} records "
                f"{recorded_rounds} round(s) done: the checkpoints were removed ({named}); restore them, or start "
                f"afresh with gastric-fl train --config {run_dir / CONFIG_FILE} --out NEW_RUN"
            )
        warn(
            f"{run_dir / CHECKPOINT_DIR}: the checkpoints of the last {recorded_rounds - done[-1]} round(s) done "
            f"({named}) were removed; resuming after round {done[-1]}, those rounds are run again"
        )
    recorded = previous.get("dataset_sha256")
    if not restart and recorded and dataset_sha256 and recorded != dataset_sha256:
        raise FederationError(
            f"{Path(dataset) / MANIFEST_FILE} changed since run {run_dir.name} started (sha256 "
            f"{recorded[:12]}... then, {dataset_sha256[:12]}... now), so resuming would train and test "
            f"on other tiles; start afresh with gastric-fl train --config {run_dir / CONFIG_FILE} "
            "--out NEW_RUN, or restore the original dataset"
        )
    if not owned_by(run_dir, OWNER):  # a run made before ownership markers
        write_marker(run_dir, OWNER, record_contents=False)
    return previous, restart


def _damaged_round(damaged: DamagedLine, before: int) -> int:
    """The round a damaged line belongs to: its ``"round"`` field if still legible, else ``before`` (the round of the
    last intact record ahead of it: records are appended in round order)."""
    try:
        text = damaged.path.read_text(encoding="utf-8", errors="replace").split("\n")[damaged.line - 1]
    except (OSError, IndexError):
        return before
    found = re.search(r'"round":\s*(\d+)', text)
    return int(found.group(1)) if found else before


def resume_checkpoint(run_dir: Path, warn: Warn) -> Checkpoint | None:
    """The newest readable checkpoint to continue from (``None``: start again at round 1), with a warning per
    problem: a damaged line of ``metrics.jsonl``/``aggregation.jsonl`` (named by file and line; its round is
    redone, so the record comes back) and a checkpoint that cannot be read (the previous one is used).
    Checkpoints after the chosen one are removed: their rounds are redone."""
    redo_from: int | None = None
    for name in (METRICS_FILE, AGGREGATION_FILE):
        scan = scan_jsonl(run_dir / name)
        for damaged in scan.damaged:
            intact_before = [int(r.get("round", 1)) for r in scan.records[: damaged.line - 1]]
            damaged_round = _damaged_round(damaged, max(intact_before, default=1))
            warn(f"{damaged}; the record is left out and round {damaged_round} is run again")
            redo_from = damaged_round if redo_from is None else min(redo_from, damaged_round)
    done = complete_checkpoints(run_dir)
    chosen: Checkpoint | None = None
    for server_round in reversed(done):
        if redo_from is not None and server_round >= redo_from:
            continue
        try:
            chosen = read_checkpoint(run_dir, server_round, warn)
        except CheckpointChanged:
            raise  # changed after it was written: never used, never silently passed over
        except FederationError as exc:
            warn(f"{exc}; falling back to the previous complete checkpoint")
            continue
        break
    for server_round in done:
        if chosen is None or server_round > chosen.round:
            drop_checkpoint(run_dir, server_round)
    if done and (chosen is None or chosen.round != done[-1]):
        after = f"resuming after round {chosen.round}" if chosen else "no usable checkpoint: starting at round 1"
        warn(f"{after} of {run_dir}")
    return chosen


def continue_run(
    run_dir: Path, hospitals: Sequence[int], strategy: Strategy, warn: Warn
) -> tuple[int, RoundRecord | None]:
    """Load ``strategy``'s state from the checkpoint to continue from and cut ``metrics.jsonl`` and
    ``aggregation.jsonl`` back to its round: the round to start at, and the checkpointed round whose evaluation is
    still to come (``None``: none). A checkpoint of other hospitals than ``hospitals`` is refused."""
    checkpoint = resume_checkpoint(run_dir, warn)
    start_round = 1
    pending: RoundRecord | None = None
    if checkpoint is not None:
        if checkpoint.hospitals and sorted(checkpoint.hospitals) != list(hospitals):
            raise FederationError(
                f"checkpoint round {checkpoint.round} is of hospitals {checkpoint.hospitals}, not "
                f"{list(hospitals)}: it is from another run"
            )
        strategy.load_state_tensors(checkpoint.strategy_tensors)
        strategy.load_state_json(checkpoint.strategy_json)
        start_round = checkpoint.round + 1
    last = start_round - 1
    for name in (METRICS_FILE, AGGREGATION_FILE):
        keep_rounds(run_dir / name, last)
    if checkpoint is not None and checkpoint.pending is not None:
        recorded = {int(r.get("round", 0)) for r in read_jsonl(run_dir / AGGREGATION_FILE)}
        if checkpoint.round not in recorded:  # its evaluation had not come back: ask for it again
            pending = RoundRecord.from_json(checkpoint.pending)
    return start_round, pending
