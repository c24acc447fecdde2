"""A hospital's side of the federation: it owns its tiles, labels, head, checkpoints and predictions.

docs/design.md, "Trust model": a hospital answers three messages (``federation.wire.contract``) and nothing else
leaves it. ``Hello`` -> its client index, tile counts and its dataset's class names; ``TrainTask`` -> its shared
tensors after local training (the recipes of ``federation.hospital.trainer``: FedSAF paper 001, Eq. 23-25) and scalar
metrics; ``EvaluateTask`` -> its test loss, accuracy and AUC. Everything else stays in the hospital's own folder:

```
<hospital folder>/
  hospital.json            the run it takes part in, its settings and the sha256 of its manifest.csv
  checkpoints/round_XXXX.safetensors   its whole model (head included) after each round, for resume
  predictions.csv          per-tile probabilities of its latest evaluation (client, path, label, prob(s), round)
  model.safetensors        the model it would deploy: base as of the latest round + its own head
  model.json               that model's card (architecture, preprocessing, threshold, metrics: docs/inference.md)
```

In the in-process engine the folder is ``<run>/hospitals/client_XX/``; in a deployment it is on the hospital's
machine (``<hospital dir>/<run id>/``). Every message may reach a fresh process (Flower starts one per message on a
deployed SuperNode), so the hospital's state between messages lives in that folder, never in memory only: a
``TrainTask`` for round ``r`` starts from the newest checkpoint of a round before ``r`` (or the common initial
model), an ``EvaluateTask`` for round ``r`` from the newest of round ``r`` or before; a ``TrainTask`` that asks for
round ``r - 1``'s evaluation first (``evaluate_previous``) does exactly that ``EvaluateTask``, then trains. A
hospital that missed a round therefore takes part again in the next one, and a resumed run repeats an uninterrupted
one bit for bit.
Within one process the model is kept between messages when it already holds that state (no reload).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from federation.config import RunConfig
from federation.derived import config_from_text, initial_state, resolve_device
from federation.errors import Diverged, FederationError, Interrupted, first_line
from federation.hospital.data import LABELS, HospitalData, check_hospitals, load_hospitals, read_dataset
from federation.hospital.outbound import OUTBOUND_FILE, record_reply
from federation.hospital.policy import (
    HospitalPolicy,
    PolicyRefusal,
    agreed_shared_keys,
    check_config,
)
from federation.hospital.privacy import (
    ACCOUNTANT_FILE,
    ACCOUNTANT_NAME,
    Accountant,
    LedgerEntry,
    load_accountant,
)
from federation.hospital.rules import EVALUATE_RULES, TRAIN_RULES, Asked, run_rules
from federation.hospital.trainer import Client
from federation.runfiles import (
    CHECKPOINT_DIR,
    HOSPITAL_FILE,
    PREDICTIONS_FILE,
    SLIDES_FILE,
    VAL_PREDICTIONS_FILE,
    prediction_columns,
)
from federation.runs import now_iso, read_json, write_json, write_predictions
from federation.strategies.context import resolved_nhead
from federation.wire.codec import Envelope, Message, decode, encode
from federation.wire.contract import (
    EvaluateReply,
    EvaluateTask,
    Failure,
    Hello,
    HelloReply,
    TrainReply,
    TrainTask,
)
from infra.formats import MANIFEST_FILE, manifest_sha256
from infra.outputs import atomic_target, remove_entries, write_atomic
from models import ModelError, create_model, head_keys, split_units
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
# What a resume Hello keeps of hospital.json: what tells a lost checkpoint from a missed round, and the ledger's anchor
RESUME_KEEPS = ("first_checkpoint", LEDGER_ANCHOR)
# Settings a resume may change: how long the run is and where and how it executes, never what it computes
RESUMABLE_SETTINGS = frozenset(
    {
        "run.rounds",
        "run.workers",
        "run.threads",
        "run.device",
        "run.engine",
        "run.keep_checkpoints",
        "run.audit",
        "run.check_gpu_memory",
    }
)


def changed_settings(before: RunConfig, after: RunConfig) -> list[str]:
    """The ``section.key`` settings that differ between ``before`` and ``after``, less `RESUMABLE_SETTINGS`."""
    old, new = dataclasses.asdict(before), dataclasses.asdict(after)
    return [
        f"{section}.{key}"
        for section, values in new.items()
        for key, value in values.items()
        if f"{section}.{key}" not in RESUMABLE_SETTINGS and old.get(section, {}).get(key) != value
    ]


@dataclass(frozen=True)
class Site:
    """Where a hospital is: its prepared dataset, which client of that dataset it is, and its folder.

    ``per_run``: the folder of run ``R`` is ``root / R`` (a deployed hospital keeps one folder per run);
    otherwise ``root`` itself (the in-process engines give each run's hospitals their own folder).
    ``rows``: the client of ``dataset`` whose tiles are this hospital's, when it differs from its index in the
    federation (``client``); a deployed hospital with a dataset of its own slides only reads client 0.
    ``policy``: the hospital's own rules (``federation.hospital.policy``); ``None`` where one operator runs the
    server and every hospital (the in-process engines): ``HospitalPolicy.operator`` of the run's configuration.
    The hospital's outbound log (``federation.hospital.outbound``) is ``root / outbound.jsonl``.
    """

    dataset: Path
    client: int
    root: Path
    per_run: bool = False
    policy: HospitalPolicy | None = None
    rows: int | None = None

    @property
    def data_index(self) -> int:
        """Its hospital index in ``dataset``, whose rows are this hospital's tiles: ``rows``, else ``client``. A
        hospital that prepared only its own slides (``prepare --clients 1``) reads hospital 0's rows while its
        identity in the federation (``client``) comes from its kit bundle."""
        return self.client if self.rows is None else self.rows

    def folder(self, run_id: str) -> Path:
        check_run_id(run_id)
        if not self.per_run:
            return self.root
        return self.root / run_id

    @property
    def outbound_log(self) -> Path:
        return self.root / OUTBOUND_FILE


def check_run_id(run_id: str) -> None:
    """A run id a hospital accepts: 1-200 printable characters, no path separator, not ``.`` or ``..``."""
    if (
        not isinstance(run_id, str)
        or not 0 < len(run_id) <= 200
        or not run_id.isprintable()
        or "/" in run_id
        or "\\" in run_id
        or run_id in (".", "..")
    ):
        raise FederationError(f"run id {run_id[:80]!r} cannot name a hospital folder: use printable characters, no /")


@dataclass
class _Loaded:
    """What this process holds of one run: settings, tiles, model, and which checkpoint the model is at."""

    run_id: str
    config: RunConfig
    data: HospitalData
    model: torch.nn.Module
    policy: HospitalPolicy
    keys: list[str]  # what this hospital sends and loads: agreed_shared_keys under its policy
    # the first round it checkpointed in this run (hospital.json): what tells a lost checkpoint from a missed round
    first_checkpoint: int | None = None
    at: tuple[int, int] | None = None  # (round, stage) the model's weights equal; None: unknown


class Hospital:
    """Answers the server's messages for one ``Site`` under its policy; never raises (a problem or a refusal is a
    ``Failure`` with one line), so one hospital's trouble does not stop the others, and records every reply in its
    outbound log before the reply leaves (``answer``)."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self._loaded: _Loaded | None = None

    # -- dispatch ------------------------------------------------------------------------------------------------
    def answer(self, envelope: Envelope) -> Envelope:
        """One exchange as it crosses the boundary: decode, handle, encode, record in the outbound log, return.
        What leaves carries the log's head before its own line (``outbound.record_reply``), of which the server
        keeps a copy. A reply whose record cannot be written is replaced by a ``Failure`` that carries no data
        (and no head: it is not in the log)."""
        header = envelope[0] if isinstance(envelope, tuple) and envelope and isinstance(envelope[0], dict) else {}
        try:
            message = decode(envelope)
        except Interrupted:
            raise
        except Exception as exc:  # a malformed message from the other side: say so, never crash
            reply: Message = Failure(
                self.site.client, f"hospital {self.site.client} cannot read the message: {first_line(exc)}"
            )
        else:
            reply = self.handle(message)
        out = encode(reply)
        try:
            out = record_reply(self.site.outbound_log, header, out)
        except OSError as exc:
            out = encode(
                Failure(
                    self.site.client,
                    f"hospital {self.site.client} cannot write its outbound log "
                    f"{self.site.outbound_log} ({exc.strerror or exc}): nothing was sent",
                )
            )
        return out

    def handle(self, message: Message) -> Message:
        try:
            if isinstance(message, Hello):
                return self.hello(message)
            if isinstance(message, TrainTask):
                return self.train(message)
            if isinstance(message, EvaluateTask):
                return self.evaluate(message)
            raise FederationError(f"a hospital does not answer {type(message).__name__} messages")
        except (FederationError, ModelError) as exc:
            return Failure(self.site.client, first_line(exc), diverged=isinstance(exc, Diverged))
        except OSError as exc:  # its folder is full, read-only, gone: this hospital cannot take part now
            where = exc.filename if exc.filename is not None else self.site.root
            return Failure(self.site.client, f"hospital {self.site.client} cannot write {where}: {exc.strerror or exc}")
        except Interrupted:  # the whole process was asked to stop: not this hospital's failure
            raise
        except SafetensorError as exc:  # safetensors' own error (reads are named where they happen: `_restore`)
            self._loaded = None
            return Failure(
                self.site.client,
                f"hospital {self.site.client} cannot read or write a checkpoint in {self.site.root}: {first_line(exc)}",
            )
        except Exception as exc:  # anything else: one line to the server, the hospital stays up
            self._loaded = None
            return Failure(
                self.site.client, f"hospital {self.site.client} failed: {type(exc).__name__}: {first_line(exc)}"
            )

    def _policy(self, config: RunConfig) -> HospitalPolicy:
        return self.site.policy if self.site.policy is not None else HospitalPolicy.operator(config)

    # -- hello ---------------------------------------------------------------------------------------------------
    def hello(self, message: Hello) -> HelloReply:
        # parsed to refuse, before round 1, a configuration this installation cannot run or its policy refuses
        config = config_from_text(message.config_toml, f"run {message.run_id} configuration")
        check_config(self._policy(config), config)
        dataset, client, own = self.site.dataset, self.site.client, self.site.data_index
        rows, classes = read_dataset(dataset)
        check_hospitals(dataset, rows, [own])
        digest = manifest_sha256(dataset)
        folder = self.site.folder(message.run_id)
        self._remove_temp_files(folder)
        record_path = folder / HOSPITAL_FILE
        if message.resume:
            if not record_path.is_file():
                raise FederationError(
                    f"hospital {client} has no state of run {message.run_id} in {folder}: it cannot resume; "
                    "start a new run instead"
                )
            previous = read_json(record_path)
            changed = changed_settings(
                config_from_text(str(previous.get("config_toml", "")), f"{record_path} configuration"), config
            )
            if changed:
                raise PolicyRefusal(
                    f"refused by hospital {client}: a resume may not change the run's settings ({', '.join(changed)} "
                    f"differ from run {message.run_id}'s start); start a new run to change them"
                )
            if previous.get("manifest_sha256") != digest:
                raise FederationError(
                    f"hospital {client}: {dataset / MANIFEST_FILE} changed since run {message.run_id} started "
                    "(its sha256 differs), so resuming would train and test on other tiles; start a new run "
                    "(gastric-fl train --out NEW_RUN ...) or restore the original dataset"
                )
            kept = {k: previous[k] for k in RESUME_KEEPS if k in previous}
            first = kept.get("first_checkpoint")
            if isinstance(first, int) and not self._checkpoints(message.run_id):
                raise FederationError(
                    f"hospital {client} has trained in run {message.run_id} since round {first}, but its checkpoints "
                    f"in {folder / CHECKPOINT_DIR} were removed: it cannot resume from the initial model without "
                    "other numbers; restore them, or start a new run"
                )
        else:
            kept = {}
            if self.site.per_run and record_path.is_file():
                raise PolicyRefusal(
                    f"refused by hospital {client}: it already holds run {message.run_id} (in {folder}); a new run "
                    "needs a new run id, and a run is continued with --resume"
                )
            self._clear(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(
            record_path,
            {
                "run_id": message.run_id,
                "client": client,
                "dataset": str(dataset),
                "manifest_sha256": digest,
                "config_toml": message.config_toml,
                "written_at": now_iso(),
                **kept,
            },
        )
        self._loaded = None
        mine = [r for r in rows if r.client == own]
        num_train = sum(1 for r in mine if r.split == "train")
        return HelloReply(client, num_train, sum(1 for r in mine if r.split == "test"), classes)

    @staticmethod
    def _remove_temp_files(folder: Path) -> None:
        """Remove the hidden temp files of this hospital's own writes that a ``kill -9`` left (``.<name>.*``)."""
        if not folder.is_dir():
            return
        found = [p for name in {*OWN_ENTRIES, CARD_FILE} for p in folder.glob(f".{name}.*")]
        if (folder / CHECKPOINT_DIR).is_dir():
            found += (folder / CHECKPOINT_DIR).glob(".round_*")
        for path in found:
            if path.is_file() or path.is_symlink():
                path.unlink(missing_ok=True)

    @staticmethod
    def _clear(folder: Path) -> None:
        """Start a run afresh: remove what a hospital writes (``OWN_ENTRIES``) and nothing else."""
        remove_entries(folder, OWN_ENTRIES)

    # -- train and evaluate --------------------------------------------------------------------------------------
    def _asked(self, loaded: _Loaded) -> Asked:
        """What the hospital's rules (`federation.hospital.rules`) look at for a task of the loaded run."""
        return Asked(loaded.policy, loaded.config, loaded.keys, loaded.model.state_dict(), lambda: self._ledger(loaded))

    def _check_finite_model(self, loaded: _Loaded, what: str) -> None:
        """Never checkpoint or deploy a model with a value that is not finite (a diverged training)."""
        for key, value in loaded.model.state_dict().items():
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                loaded.at = None  # restored from the last good checkpoint by the next message
                raise Diverged(
                    f"hospital {self.site.client}: its model became not finite {what} ({key}); it was not kept, "
                    "its last good model stays"
                )

    def train(self, task: TrainTask) -> TrainReply:
        if task.instruction.client != self.site.client:
            raise PolicyRefusal(
                f"refused by hospital {self.site.client}: it was sent client {task.instruction.client}'s task"
            )
        loaded = self._load(task.run_id)
        recipe = task.instruction.recipe
        asked = self._asked(loaded)
        run_rules(TRAIN_RULES, asked, task)  # its policy's checks, in order (federation.hospital.rules)
        ledger = asked.ledger if recipe.private else None
        previous = None
        if task.evaluate_previous:  # what round r-1's EvaluateTask would have done, in the same order
            if task.instruction.shared is None:
                raise FederationError(
                    f"hospital {self.site.client}: asked to evaluate round {task.server_round - 1}'s model with the "
                    "shared part sent, but no shared part came"
                )
            self._restore(loaded, task.server_round - 1, inclusive=True)
            previous = self._evaluate(loaded, self._client(loaded), task.server_round - 1, task.instruction.shared)
        self._restore(loaded, task.server_round, inclusive=False)
        client = self._client(loaded)
        start = time.perf_counter()
        loaded.at = None  # the weights change from here on
        reply = client.train(task.instruction, task.server_round, task.seed)
        seconds = time.perf_counter() - start
        self._check_finite_model(loaded, "after training")
        if ledger is not None:  # a DP round: its steps go into the ledger
            # recorded before anything leaves: a round whose reply is lost still spent its budget
            ledger.step(
                LedgerEntry(
                    round=task.server_round,
                    noise_multiplier=recipe.dp_noise_multiplier,
                    sample_rate=recipe.dp_sample_rate,
                    steps=client.dp_steps,
                    unit=recipe.dp_unit,
                    tiles_per_unit=recipe.dp_tiles_per_unit,
                    max_grad_norm=recipe.dp_max_grad_norm,
                    delta=recipe.dp_delta,
                )
            )
            self._save_ledger(loaded, ledger)
            reply.metrics.update(
                dp_epsilon=ledger.epsilon(recipe.dp_delta), dp_delta=recipe.dp_delta, dp_steps=float(ledger.steps)
            )
        if set(reply.shared) != set(loaded.keys) or not set(reply.second_moments) <= set(loaded.keys):
            raise FederationError(f"hospital {self.site.client}: its reply would carry other tensors than agreed")
        self._save(loaded, task.server_round, TRAINED)
        evaluation = self._evaluate(loaded, client, task.server_round, None) if task.evaluate else None
        # the reply names the hospital by its federation index (its tiles may be client 0 of its own dataset)
        return dataclasses.replace(
            reply, client=self.site.client, seconds=seconds, evaluation=evaluation, previous=previous
        )

    def evaluate(self, task: EvaluateTask) -> EvaluateReply:
        if task.client != self.site.client:
            raise PolicyRefusal(
                f"refused by hospital {self.site.client}: it was sent client {task.client}'s evaluation"
            )
        loaded = self._load(task.run_id)
        run_rules(EVALUATE_RULES, self._asked(loaded), task)
        self._restore(loaded, task.server_round, inclusive=True)
        client = self._client(loaded)
        return self._evaluate(loaded, client, task.server_round, task.shared)

    def _evaluate(
        self, loaded: _Loaded, client: Client, server_round: int, shared: Mapping[str, torch.Tensor] | None
    ) -> EvaluateReply:
        """Load ``shared`` (``None``: keep the model), evaluate, keep the predictions, checkpoint and export.

        With ``client.precise_bn``, BatchNorm statistics the hospital keeps (``strategy.bn``, a head's) are
        recomputed for the weights just loaded: they were computed for the hospital's weights before the server's
        arrived, and would normalise the evaluated model with another model's statistics.
        """
        start = time.perf_counter()
        loaded.at = None
        client.load_shared(shared)
        if shared is not None and loaded.config.client.precise_bn:
            client.recompute_batchnorm(keep=shared.keys())
        result = client.evaluate()
        seconds = time.perf_counter() - start
        if shared is not None:  # otherwise the model is one already checked: just trained, or a checkpoint
            self._check_finite_model(loaded, "with what it was sent")
        if not math.isfinite(result.loss):
            loaded.at = None
            raise Diverged(
                f"hospital {self.site.client}: the evaluation of round {server_round}'s model is not finite "
                f"(loss {result.loss}); it was not kept or deployed, its last good model stays"
            )
        folder = self.site.folder(loaded.run_id)
        data = loaded.data
        # the binary task keeps its one column, P(abnormal); other class lists get one column per class
        probs = result.prob_abnormal[:, None] if data.classes == LABELS else result.probs
        columns = prediction_columns(data.classes)

        def rows(paths: list[str], labels: np.ndarray, prob: np.ndarray) -> Iterator[list[object]]:
            for path, label, p in zip(paths, labels, prob, strict=True):
                yield [data.hospital, path, data.classes[int(label)], *(f"{v:.17g}" for v in p), server_round]

        write_predictions(folder / PREDICTIONS_FILE, rows(data.test_paths, data.test_y, probs), columns)
        if data.num_val and data.val_y is not None:
            # The validation split never leaves the hospital either: it is where the hospital's threshold is
            # chosen (app.operating), so that the test split is only judged.
            val = client.evaluate("val")
            val_probs = val.prob_abnormal[:, None] if data.classes == LABELS else val.probs
            write_predictions(folder / VAL_PREDICTIONS_FILE, rows(data.val_paths, data.val_y, val_probs), columns)
        self._save(loaded, server_round, EVALUATED)
        self._export(loaded, server_round)
        metrics: dict[str, float | None] = {"loss": result.loss, "acc": result.acc, "auc": result.auc}
        return EvaluateReply(self.site.client, data.num_test, metrics, seconds)

    # -- state -----------------------------------------------------------------------------------------------------
    def _load(self, run_id: str) -> _Loaded:
        if self._loaded is not None and self._loaded.run_id == run_id:
            return self._loaded
        folder = self.site.folder(run_id)
        record_path = folder / HOSPITAL_FILE
        if not record_path.is_file():
            raise FederationError(f"hospital {self.site.client} was not told about run {run_id} (no Hello)")
        record = read_json(record_path)
        config = config_from_text(str(record["config_toml"]), f"{record_path} configuration")
        policy = self._policy(config)
        check_config(policy, config)  # the policy may have changed since the Hello
        if config.run.threads > 0:
            torch.set_num_threads(config.run.threads)
        own = self.site.data_index
        data = load_hospitals(self.site.dataset, config.data.input_size, config.model.in_chans, [own])
        model = create_model(config.model.name, len(data[own].classes), config.model.in_chans, norm=config.model.norm)
        keys = agreed_shared_keys(config, model)
        first = record.get("first_checkpoint")
        self._loaded = _Loaded(
            run_id, config, data[own], model, policy, keys, first if isinstance(first, int) else None
        )
        return self._loaded

    def _ledger(self, loaded: _Loaded) -> Accountant:
        """The hospital's privacy ledger for the run (`federation.hospital.privacy`), from its own folder, checked
        against
        the anchor ``hospital.json`` keeps of it: a ledger removed, reset or edited since it was last written is
        refused (``FederationError``), never started again from zero. No ledger and no anchor: a run before its
        first DP round."""
        folder = self.site.folder(loaded.run_id)
        record = read_json(folder / HOSPITAL_FILE)
        try:
            ledger = load_accountant(folder)
            anchor = record.get(LEDGER_ANCHOR)
            if (
                anchor is None
                and ledger is None
                and loaded.first_checkpoint is not None
                and loaded.config.privacy.enabled
            ):
                raise ValueError(
                    f"{folder / HOSPITAL_FILE} keeps no record of the privacy ledger although this DP run has trained "
                    f"since round {loaded.first_checkpoint}; restore both from the hospital's backup"
                )
            if anchor is not None:
                (ledger or Accountant()).check_anchor(anchor, str(folder / ACCOUNTANT_FILE))
        except ValueError as exc:
            raise FederationError(f"hospital {self.site.client}: {exc}") from None
        return ledger or Accountant()

    def _save_ledger(self, loaded: _Loaded, ledger: Accountant) -> None:
        """Write the ledger, then its anchor in ``hospital.json`` (a stop between the two leaves a ledger longer
        than its anchor, which is accepted: added entries only raise epsilon)."""
        folder = self.site.folder(loaded.run_id)
        write_atomic(folder / ACCOUNTANT_FILE, (json.dumps(ledger.to_json(), indent=2) + "\n").encode("utf-8"))
        record_path = folder / HOSPITAL_FILE
        write_json(record_path, {**read_json(record_path), LEDGER_ANCHOR: ledger.anchor()})

    def _client(self, loaded: _Loaded) -> Client:
        """A ``Client`` over the loaded model; its head is the last ``strategy.nhead`` units (the units a recipe's
        head phase trains; the base phase trains the rest, BatchNorm the hospital keeps local included)."""
        config = loaded.config
        return Client(
            loaded.data,
            loaded.model,
            loaded.keys,
            batch_size=config.data.batch_size,
            eval_batch_size=config.data.eval_batch_size,
            augment=config.data.augment,
            device=resolve_device(config.run.device),
            head_keys=head_keys(split_units(loaded.model), resolved_nhead(config)),
            precision=config.run.precision,
            deterministic=config.run.deterministic,
        )

    def _checkpoints(self, run_id: str) -> dict[int, Path]:
        folder = self.site.folder(run_id) / CHECKPOINT_DIR
        out: dict[int, Path] = {}
        if folder.is_dir():
            for path in folder.glob("round_*.safetensors"):
                with contextlib.suppress(ValueError):
                    out[int(path.stem.removeprefix("round_"))] = path
        return out

    def _restore(self, loaded: _Loaded, server_round: int, *, inclusive: bool) -> None:
        """Put the model at the newest checkpoint of a round before ``server_round`` (or at it, ``inclusive``)."""
        saved = self._checkpoints(loaded.run_id)
        usable = [r for r in saved if r < server_round or (inclusive and r == server_round)]
        if not usable:
            first = loaded.first_checkpoint
            if first is not None and first < server_round:
                # it has trained in this run, yet no checkpoint before this round is left: starting again from the
                # initial model would give other numbers without a word
                raise FederationError(
                    f"hospital {self.site.client} has no checkpoint before round {server_round} of run "
                    f"{loaded.run_id}, although it saved one for round {first}: its checkpoints in "
                    f"{self.site.folder(loaded.run_id) / CHECKPOINT_DIR} were removed; restore them, or start a new run"
                )
            if loaded.at != (0, EVALUATED):
                initial, _ = initial_state(loaded.config, len(loaded.data.classes))
                loaded.model.load_state_dict(initial)
                loaded.at = (0, EVALUATED)
            return
        newest = max(usable)
        path = saved[newest]
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
            stage = int(metadata.get("stage", EVALUATED))
        except (SafetensorError, OSError, ValueError) as exc:  # cut short or damaged: a read error, named as one
            raise FederationError(
                f"hospital {self.site.client}: its checkpoint {path} cannot be read ({first_line(exc)}): delete it to "
                "continue from an earlier round, or restore it from a backup"
            ) from None
        if loaded.at == (newest, stage):
            return
        try:
            state = load_file(str(path))
        except Exception as exc:  # a damaged file: name it, say what to do
            raise FederationError(
                f"hospital checkpoint {path} cannot be read ({exc}): delete it to continue from an earlier round"
            ) from exc
        recorded = metadata.get(TENSORS_SHA256)
        if recorded is not None and tensors_sha256(state) != recorded:
            raise FederationError(
                f"hospital {self.site.client}: its checkpoint {path} does not hash to the sha256 written into it when "
                f"it was saved ({recorded[:12]}... then, {tensors_sha256(state)[:12]}... now): it changed since; "
                "restore it from a backup, or delete it to continue from an earlier round"
            )
        loaded.model.load_state_dict(state)
        loaded.at = (newest, stage)

    def _save(self, loaded: _Loaded, server_round: int, stage: int) -> None:
        folder = self.site.folder(loaded.run_id) / CHECKPOINT_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"round_{server_round:04d}.safetensors"
        state = {k: v.detach().cpu().contiguous() for k, v in loaded.model.state_dict().items()}
        try:
            _atomic_save(
                state, path, {"round": str(server_round), "stage": str(stage), TENSORS_SHA256: tensors_sha256(state)}
            )
        except SafetensorError as exc:  # safetensors' own error for a failed write (a full disk, for one)
            self._loaded = None
            raise FederationError(
                f"hospital {self.site.client} cannot write its checkpoint {path}: {first_line(exc)}"
            ) from None
        loaded.at = (server_round, stage)
        if loaded.first_checkpoint is None:  # once per run, kept in hospital.json for a later process
            record_path = self.site.folder(loaded.run_id) / HOSPITAL_FILE
            write_json(record_path, {**read_json(record_path), "first_checkpoint": server_round})
            loaded.first_checkpoint = server_round
        keep = loaded.config.run.keep_checkpoints + 1  # one more than the server: it may be a round ahead
        saved = self._checkpoints(loaded.run_id)
        for r, old in saved.items():
            # rounds after this one are left over from an interrupted run that is being redone
            if r > server_round or r <= server_round - keep:
                old.unlink(missing_ok=True)

    def _export(self, loaded: _Loaded, server_round: int) -> None:
        """The model bundle (`models.bundle`) the hospital would deploy after ``server_round``:
        ``model.safetensors`` (a link to its checkpoint when the file system allows, so it costs no copy; its
        metadata names the round) and ``model.json``, its card (`federation.hospital.export.export_card`).

        The bundle is replaced as one, and only once everything it says is known: the card is made first (its DP
        guarantee reads the ledger, which may be refused), both files are written beside the bundle, then put in
        place together (`federation.hospital.export.replace_bundle`). A round refused on the way leaves the last good
        bundle exactly as it was."""
        from federation.hospital.export import export_card, replace_bundle

        folder = self.site.folder(loaded.run_id)
        card = export_card(
            config=loaded.config,
            model=loaded.model,
            dataset=self.site.dataset,
            client=self.site.data_index,
            grayscale=loaded.data.grayscale,
            classes=loaded.data.classes,
            run_id=loaded.run_id,
            server_round=server_round,
            hospital_record=read_json(folder / HOSPITAL_FILE),
            predictions=folder / PREDICTIONS_FILE,
            privacy=self._card_privacy(loaded),
        )
        replace_bundle(folder, card, folder / CHECKPOINT_DIR / f"round_{server_round:04d}.safetensors")
        # the hospital's description of its own tissue (models.shift): written here, read by predict, never sent
        from federation.hospital.tissue import describe_tissue

        describe_tissue(loaded.model, loaded.data, folder, server_round)

    def _card_privacy(self, loaded: _Loaded) -> dict[str, Any]:
        """What the model card says of the weights' DP guarantee (empty without ``[privacy]``)."""
        privacy = loaded.config.privacy
        if not privacy.enabled:
            return {}
        ledger = self._ledger(loaded)
        if not ledger.entries:
            return {}
        trained = ledger.summary()  # what was trained, from the ledger, never what the run asked for
        return {
            "epsilon": ledger.epsilon(privacy.run_delta),
            "delta": privacy.run_delta,
            "unit": trained["unit"],
            "noise_multiplier": trained["noise_multiplier"],
            "sample_rate": trained["sample_rate"],
            "max_grad_norm": trained["max_grad_norm"],
            "tiles_per_unit": trained["tiles_per_unit"],
            "steps": ledger.steps,
            "accountant": ACCOUNTANT_NAME,
            "ledger": ACCOUNTANT_FILE,
            "not_covered": "the test metrics, training loss and Fisher trace the hospital reported (docs/privacy.md)",
        }


def tensors_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over a state's tensors in key order: each key, dtype, shape and raw bytes (``hashlib``). A hospital's
    checkpoint carries it in its metadata (``TENSORS_SHA256``) and `Hospital._restore` refuses a checkpoint whose
    tensors no longer hash to it (a flipped byte loads silently otherwise); a checkpoint written before this
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
