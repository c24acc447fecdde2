"""A hospital's state of one run, kept in its own folder (docs/design.md, "Trust model"): its record of the run
(``hospital.json``), its checkpoints, its privacy ledger, and the clean-up of what an interrupted write left.

Every message may reach a fresh process, so what a hospital knows between messages is here, never in memory only
(`federation.hospital.handler`). Each write is atomic (a temp file beside the target, then one rename): a ``kill
-9`` leaves the old file or the new one, and a hidden temp file that the next Hello removes (`remove_temp_files`).

- Checkpoints (``checkpoints/round_XXXX.safetensors``): the whole model after a round, with its stage (`TRAINED`,
  `EVALUATED`) and the sha256 of its tensors (`tensors_sha256`) in its metadata, so that a checkpoint changed since
  it was written is refused rather than loaded (`RunStore.read_checkpoint`).
- The privacy ledger (`federation.hospital.privacy.Accountant`, ``privacy.json``), anchored in
  ``hospital.json`` (`LEDGER_ANCHOR`): a ledger removed, reset or edited since it was last written is refused, never
  started again from zero (`RunStore.ledger`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from federation.errors import FederationError, first_line
from federation.hospital.privacy import ACCOUNTANT_FILE, Accountant, load_accountant
from federation.runfiles import (
    CHECKPOINT_DIR,
    HOSPITAL_FILE,
    PREDICTIONS_FILE,
    SLIDES_FILE,
    VAL_PREDICTIONS_FILE,
)
from federation.runs import read_json, write_json
from infra.outputs import atomic_target, remove_entries, write_atomic
from models.names import CARD_FILE, WEIGHTS_FILE

# Files and folders a hospital writes into its folder: the only ones it ever replaces or removes.
OWN_ENTRIES = (
    HOSPITAL_FILE,
    CHECKPOINT_DIR,
    PREDICTIONS_FILE,
    VAL_PREDICTIONS_FILE,
    SLIDES_FILE,
    WEIGHTS_FILE,
    CARD_FILE,
    ACCOUNTANT_FILE,
)
TRAINED, EVALUATED = 1, 2  # stages of a round's checkpoint
TENSORS_SHA256 = "tensors_sha256"  # a checkpoint's metadata: the sha256 of its tensors (`tensors_sha256`)
LEDGER_ANCHOR = (
    "privacy_ledger"  # hospital.json's record of the privacy ledger (federation.hospital.privacy.Accountant.anchor)
)


def tensors_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over a state's tensors in key order: each key, dtype, shape and raw bytes (``hashlib``). A hospital's
    checkpoint carries it in its metadata (``TENSORS_SHA256``) and `RunStore.read_checkpoint` refuses a checkpoint
    whose tensors no longer hash to it (a flipped byte loads silently otherwise); a checkpoint written before this
    metadata existed is loaded unchecked."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _atomic_save(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, Any]) -> None:
    with atomic_target(path) as tmp:
        save_file(state, str(tmp), metadata=metadata)


def remove_temp_files(folder: Path) -> None:
    """Remove the hidden temp files of this hospital's own writes that a ``kill -9`` left (``.<name>.*``)."""
    if not folder.is_dir():
        return
    found = [p for name in {*OWN_ENTRIES, CARD_FILE} for p in folder.glob(f".{name}.*")]
    if (folder / CHECKPOINT_DIR).is_dir():
        found += (folder / CHECKPOINT_DIR).glob(".round_*")
    for path in found:
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)


def clear(folder: Path) -> None:
    """Start a run afresh: remove what a hospital writes (``OWN_ENTRIES``) and nothing else."""
    remove_entries(folder, OWN_ENTRIES)


@dataclass(frozen=True)
class RunStore:
    """One run's folder at hospital ``hospital`` (its index in the federation, which its messages name)."""

    folder: Path
    hospital: int

    # -- hospital.json ---------------------------------------------------------------------------------------------
    @property
    def record_path(self) -> Path:
        return self.folder / HOSPITAL_FILE

    def read_record(self) -> dict[str, Any]:
        return read_json(self.record_path)

    def update_record(self, **fields: Any) -> None:
        """Add ``fields`` to ``hospital.json`` (written atomically)."""
        write_json(self.record_path, {**read_json(self.record_path), **fields})

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def checkpoints(self) -> dict[int, Path]:
        """The run's checkpoints by round."""
        folder = self.folder / CHECKPOINT_DIR
        out: dict[int, Path] = {}
        if folder.is_dir():
            for path in folder.glob("round_*.safetensors"):
                with contextlib.suppress(ValueError):
                    out[int(path.stem.removeprefix("round_"))] = path
        return out

    def checkpoint_path(self, server_round: int) -> Path:
        return self.folder / CHECKPOINT_DIR / f"round_{server_round:04d}.safetensors"

    def checkpoint_stage(self, path: Path) -> tuple[int, dict[str, str]]:
        """A checkpoint's stage (`TRAINED`, `EVALUATED`) and metadata, read without its tensors."""
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
            stage = int(metadata.get("stage", EVALUATED))
        except (SafetensorError, OSError, ValueError) as exc:  # cut short or damaged: a read error, named as one
            raise FederationError(
                f"hospital {self.hospital}: its checkpoint {path} cannot be read ({first_line(exc)}): delete it to "
                "continue from an earlier round, or restore it from a backup"
            ) from None
        return stage, metadata

    def read_checkpoint(self, path: Path, metadata: Mapping[str, str]) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors, refused (`FederationError`) when they no longer hash to the sha256 its
        ``metadata`` recorded when it was saved."""
        try:
            state = load_file(str(path))
        except Exception as exc:  # a damaged file: name it, say what to do
            raise FederationError(
                f"hospital checkpoint {path} cannot be read ({exc}): delete it to continue from an earlier round"
            ) from exc
        recorded = metadata.get(TENSORS_SHA256)
        if recorded is not None and tensors_sha256(state) != recorded:
            raise FederationError(
                f"hospital {self.hospital}: its checkpoint {path} does not hash to the sha256 written into it when "
                f"it was saved ({recorded[:12]}... then, {tensors_sha256(state)[:12]}... now): it changed since; "
                "restore it from a backup, or delete it to continue from an earlier round"
            )
        return state

    def save_checkpoint(self, model: torch.nn.Module, server_round: int, stage: int) -> None:
        """Write ``model``'s whole state as round ``server_round``'s checkpoint at ``stage``, with the sha256 of its
        tensors; a failed write (safetensors' own error: a full disk, for one) is a `FederationError`."""
        folder = self.folder / CHECKPOINT_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"round_{server_round:04d}.safetensors"
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        try:
            _atomic_save(
                state, path, {"round": str(server_round), "stage": str(stage), TENSORS_SHA256: tensors_sha256(state)}
            )
        except SafetensorError as exc:
            raise FederationError(
                f"hospital {self.hospital} cannot write its checkpoint {path}: {first_line(exc)}"
            ) from None

    def prune(self, server_round: int, keep: int) -> None:
        """Keep the ``keep`` newest checkpoints up to ``server_round``; rounds after it are left over from an
        interrupted run that is being redone."""
        for r, old in self.checkpoints().items():
            if r > server_round or r <= server_round - keep:
                old.unlink(missing_ok=True)

    # -- the privacy ledger ----------------------------------------------------------------------------------------
    def ledger(self, first_checkpoint: int | None, private: bool) -> Accountant:
        """The hospital's privacy ledger for the run (`federation.hospital.privacy`), from its own folder, checked
        against the anchor ``hospital.json`` keeps of it: a ledger removed, reset or edited since it was last
        written is refused (``FederationError``), never started again from zero. No ledger and no anchor: a run
        before its first DP round (``private``: the run trains with DP; ``first_checkpoint``: the first round the
        hospital checkpointed)."""
        folder = self.folder
        record = read_json(folder / HOSPITAL_FILE)
        try:
            ledger = load_accountant(folder)
            anchor = record.get(LEDGER_ANCHOR)
            if anchor is None and ledger is None and first_checkpoint is not None and private:
                raise ValueError(
                    f"{folder / HOSPITAL_FILE} keeps no record of the privacy ledger although this DP run has trained "
                    f"since round {first_checkpoint}; restore both from the hospital's backup"
                )
            if anchor is not None:
                (ledger or Accountant()).check_anchor(anchor, str(folder / ACCOUNTANT_FILE))
        except ValueError as exc:
            raise FederationError(f"hospital {self.hospital}: {exc}") from None
        return ledger or Accountant()

    def save_ledger(self, ledger: Accountant) -> None:
        """Write the ledger, then its anchor in ``hospital.json`` (a stop between the two leaves a ledger longer
        than its anchor, which is accepted: added entries only raise epsilon)."""
        write_atomic(self.folder / ACCOUNTANT_FILE, (json.dumps(ledger.to_json(), indent=2) + "\n").encode("utf-8"))
        self.update_record(**{LEDGER_ANCHOR: ledger.anchor()})
