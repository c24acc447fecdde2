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

What the hospital checks runs as chains of named rules (`federation.hospital.rules`): the inbound ones before a task
restores, trains or loads anything, the outbound ones before what it produced is kept or leaves. Its folder's
checkpoints, record and privacy ledger are `federation.hospital.store`'s; its model bundle,
`federation.hospital.export`'s; its training and evaluation, `federation.hospital.trainer`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError

from federation.config import RunConfig
from federation.derived import config_from_text, initial_state, resolve_device
from federation.errors import Diverged, FederationError, Interrupted, first_line
from federation.hospital.data import LABELS, HospitalData, check_hospitals, load_hospitals, read_dataset
from federation.hospital.evaluation import EvalResult
from federation.hospital.outbound import OUTBOUND_FILE, record_reply
from federation.hospital.policy import (
    HospitalPolicy,
    PolicyRefusal,
    agreed_shared_keys,
    check_config,
)
from federation.hospital.privacy import Accountant, LedgerEntry
from federation.hospital.rules import (
    EVALUATE_RULES,
    EVALUATED_RULES,
    TRAIN_REPLY_RULES,
    TRAIN_RULES,
    TRAINED_RULES,
    Asked,
    Leaving,
    run_outbound,
    run_rules,
)
from federation.hospital.store import EVALUATED, LEDGER_ANCHOR, TRAINED, RunStore, clear, remove_temp_files
from federation.hospital.trainer import Trainer
from federation.runfiles import (
    CHECKPOINT_DIR,
    PREDICTIONS_FILE,
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
from models import ModelError, create_model, head_keys, split_units

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
    federation (``hospital``); a deployed hospital with a dataset of its own slides only reads client 0.
    ``policy``: the hospital's own rules (``federation.hospital.policy``); ``None`` where one operator runs the
    server and every hospital (the in-process engines): ``HospitalPolicy.operator`` of the run's configuration.
    The hospital's outbound log (``federation.hospital.outbound``) is ``root / outbound.jsonl``.
    """

    dataset: Path
    hospital: int
    root: Path
    per_run: bool = False
    policy: HospitalPolicy | None = None
    rows: int | None = None

    @property
    def data_index(self) -> int:
        """Its hospital index in ``dataset``, whose rows are this hospital's tiles: ``rows``, else ``hospital``. A
        hospital that prepared only its own slides (``prepare --clients 1``) reads hospital 0's rows while its
        identity in the federation (``hospital``) comes from its kit bundle."""
        return self.hospital if self.rows is None else self.rows

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
@dataclass
class _Loaded:
    """What this process holds of one run: settings, tiles, model, and which checkpoint the model is at."""

    run_id: str
    config: RunConfig
    data: HospitalData
    model: torch.nn.Module
    policy: HospitalPolicy
    keys: list[str]  # what this hospital sends and loads: agreed_shared_keys under its policy
    store: RunStore  # the run's folder at this hospital: its record, checkpoints and privacy ledger
    # the first round it checkpointed in this run (hospital.json): what tells a lost checkpoint from a missed round
    first_checkpoint: int | None = None
    at: tuple[int, int] | None = None  # (round, stage) the model's weights equal; None: unknown


def _resumed(store: RunStore, message: Hello, config: RunConfig, digest: str, dataset: Path) -> dict[str, object]:
    """What a resume ``Hello`` keeps of ``hospital.json`` (`RESUME_KEEPS`), once the resume is one the hospital
    can do: it holds the run, the run's settings are those it started with (less `RESUMABLE_SETTINGS`), its
    dataset's manifest is unchanged, and a run it has trained in still has its checkpoints."""
    hospital, folder, record_path = store.hospital, store.folder, store.record_path
    if not record_path.is_file():
        raise FederationError(
            f"hospital {hospital} has no state of run {message.run_id} in {folder}: it cannot resume; "
            "start a new run instead"
        )
    previous = read_json(record_path)
    changed = changed_settings(
        config_from_text(str(previous.get("config_toml", "")), f"{record_path} configuration"), config
    )
    if changed:
        raise PolicyRefusal(
            f"refused by hospital {hospital}: a resume may not change the run's settings ({', '.join(changed)} "
            f"differ from run {message.run_id}'s start); start a new run to change them"
        )
    if previous.get("manifest_sha256") != digest:
        raise FederationError(
            f"hospital {hospital}: {dataset / MANIFEST_FILE} changed since run {message.run_id} started "
            "(its sha256 differs), so resuming would train and test on other tiles; start a new run "
            "(gastric-fl train --out NEW_RUN ...) or restore the original dataset"
        )
    kept = {k: previous[k] for k in RESUME_KEEPS if k in previous}
    first = kept.get("first_checkpoint")
    if isinstance(first, int) and not store.checkpoints():
        raise FederationError(
            f"hospital {hospital} has trained in run {message.run_id} since round {first}, but its checkpoints "
            f"in {folder / CHECKPOINT_DIR} were removed: it cannot resume from the initial model without "
            "other numbers; restore them, or start a new run"
        )
    return kept


def _trainer(loaded: _Loaded) -> Trainer:
    """A ``Trainer`` over the loaded model; its head is the last ``strategy.nhead`` units (the units a recipe's
    head phase trains; the base phase trains the rest, BatchNorm the hospital keeps local included)."""
    config = loaded.config
    return Trainer(
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


def _write_predictions(loaded: _Loaded, trainer: Trainer, result: EvalResult, server_round: int) -> None:
    """Keep an evaluation's per-tile probabilities in the hospital's folder: its test split's, and its validation
    split's (evaluated here) when it has one."""
    folder = loaded.store.folder
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
        val = trainer.evaluate("val")
        val_probs = val.prob_abnormal[:, None] if data.classes == LABELS else val.probs
        write_predictions(folder / VAL_PREDICTIONS_FILE, rows(data.val_paths, data.val_y, val_probs), columns)


class Hospital:
    """Answers the server's messages for one ``Site`` under its policy; never raises (a problem or a refusal is a
    ``Failure`` with one line), so one hospital's trouble does not stop the others, and records every reply in its
    outbound log before the reply leaves (``answer``). What it checks: the inbound rules before a task, the
    outbound rules before anything is kept or leaves (`federation.hospital.rules`); what it keeps between messages:
    its run's folder (`federation.hospital.store`)."""

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
                self.site.hospital, f"hospital {self.site.hospital} cannot read the message: {first_line(exc)}"
            )
        else:
            reply = self.handle(message)
        out = encode(reply)
        try:
            out = record_reply(self.site.outbound_log, header, out)
        except OSError as exc:
            out = encode(
                Failure(
                    self.site.hospital,
                    f"hospital {self.site.hospital} cannot write its outbound log "
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
            return Failure(self.site.hospital, first_line(exc), diverged=isinstance(exc, Diverged))
        except OSError as exc:  # its folder is full, read-only, gone: this hospital cannot take part now
            where = exc.filename if exc.filename is not None else self.site.root
            return Failure(
                self.site.hospital, f"hospital {self.site.hospital} cannot write {where}: {exc.strerror or exc}"
            )
        except Interrupted:  # the whole process was asked to stop: not this hospital's failure
            raise
        except SafetensorError as exc:  # safetensors' own error (reads are named where they happen: the store)
            self._loaded = None
            return Failure(
                self.site.hospital,
                f"hospital {self.site.hospital} cannot read or write a checkpoint in {self.site.root}: "
                f"{first_line(exc)}",
            )
        except Exception as exc:  # anything else: one line to the server, the hospital stays up
            self._loaded = None
            return Failure(
                self.site.hospital, f"hospital {self.site.hospital} failed: {type(exc).__name__}: {first_line(exc)}"
            )

    def _policy(self, config: RunConfig) -> HospitalPolicy:
        return self.site.policy if self.site.policy is not None else HospitalPolicy.operator(config)

    def _store(self, run_id: str) -> RunStore:
        return RunStore(self.site.folder(run_id), self.site.hospital)

    # -- hello ---------------------------------------------------------------------------------------------------
    def hello(self, message: Hello) -> HelloReply:
        # parsed to refuse, before round 1, a configuration this installation cannot run or its policy refuses
        config = config_from_text(message.config_toml, f"run {message.run_id} configuration")
        check_config(self._policy(config), config)
        dataset, hospital, own = self.site.dataset, self.site.hospital, self.site.data_index
        rows, classes = read_dataset(dataset)
        check_hospitals(dataset, rows, [own])
        digest = manifest_sha256(dataset)
        store = self._store(message.run_id)
        folder = store.folder
        remove_temp_files(folder)
        record_path = store.record_path
        if message.resume:
            kept = _resumed(store, message, config, digest, dataset)
        else:
            kept = {}
            if self.site.per_run and record_path.is_file():
                raise PolicyRefusal(
                    f"refused by hospital {hospital}: it already holds run {message.run_id} (in {folder}); a new run "
                    "needs a new run id, and a run is continued with --resume"
                )
            clear(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(
            record_path,
            {
                "run_id": message.run_id,
                "client": hospital,
                "dataset": str(dataset),
                "manifest_sha256": digest,
                "config_toml": message.config_toml,
                "written_at": now_iso(),
                **kept,
            },
        )
        self._loaded = None
        mine = [r for r in rows if r.hospital == own]
        num_train = sum(1 for r in mine if r.split == "train")
        return HelloReply(hospital, num_train, sum(1 for r in mine if r.split == "test"), classes)

    # -- train and evaluate --------------------------------------------------------------------------------------
    def _asked(self, loaded: _Loaded) -> Asked:
        """What the hospital's inbound rules (`federation.hospital.rules`) look at for a task of the loaded run."""
        return Asked(loaded.policy, loaded.config, loaded.keys, loaded.model.state_dict(), lambda: self._ledger(loaded))

    def train(self, task: TrainTask) -> TrainReply:
        if task.instruction.client != self.site.hospital:
            raise PolicyRefusal(
                f"refused by hospital {self.site.hospital}: it was sent client {task.instruction.client}'s task"
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
                    f"hospital {self.site.hospital}: asked to evaluate round {task.server_round - 1}'s model with the "
                    "shared part sent, but no shared part came"
                )
            self._restore(loaded, task.server_round - 1, inclusive=True)
            previous = self._evaluate(loaded, _trainer(loaded), task.server_round - 1, task.instruction.shared)
        self._restore(loaded, task.server_round, inclusive=False)
        trainer = _trainer(loaded)
        start = time.perf_counter()
        loaded.at = None  # the weights change from here on
        reply = trainer.train(task.instruction, task.server_round, task.seed)
        seconds = time.perf_counter() - start
        leaving = Leaving(self.site.hospital, task.server_round, loaded.model, loaded.keys, how="after training")
        run_outbound(TRAINED_RULES, leaving)  # before anything is kept (federation.hospital.rules)
        if ledger is not None:  # a DP round: its steps go into the ledger
            # recorded before anything leaves: a round whose reply is lost still spent its budget
            ledger.step(LedgerEntry.of_round(task.server_round, recipe, trainer.dp_steps))
            loaded.store.save_ledger(ledger)
            reply.metrics.update(
                dp_epsilon=ledger.epsilon(recipe.dp_delta), dp_delta=recipe.dp_delta, dp_steps=float(ledger.steps)
            )
        run_outbound(TRAIN_REPLY_RULES, dataclasses.replace(leaving, how=None, reply=reply))
        self._save(loaded, task.server_round, TRAINED)
        evaluation = self._evaluate(loaded, trainer, task.server_round, None) if task.evaluate else None
        # the reply names the hospital by its federation index (its tiles may be client 0 of its own dataset)
        return dataclasses.replace(
            reply, client=self.site.hospital, seconds=seconds, evaluation=evaluation, previous=previous
        )

    def evaluate(self, task: EvaluateTask) -> EvaluateReply:
        if task.client != self.site.hospital:
            raise PolicyRefusal(
                f"refused by hospital {self.site.hospital}: it was sent client {task.client}'s evaluation"
            )
        loaded = self._load(task.run_id)
        run_rules(EVALUATE_RULES, self._asked(loaded), task)
        self._restore(loaded, task.server_round, inclusive=True)
        return self._evaluate(loaded, _trainer(loaded), task.server_round, task.shared)

    def _evaluate(
        self, loaded: _Loaded, trainer: Trainer, server_round: int, shared: Mapping[str, torch.Tensor] | None
    ) -> EvaluateReply:
        """Load ``shared`` (``None``: keep the model), evaluate, keep the predictions, checkpoint and export.

        With ``client.precise_bn``, BatchNorm statistics the hospital keeps (``strategy.bn``, a head's) are
        recomputed for the weights just loaded: they were computed for the hospital's weights before the server's
        arrived, and would normalise the evaluated model with another model's statistics.
        """
        start = time.perf_counter()
        loaded.at = None
        trainer.load_shared(shared)
        if shared is not None and loaded.config.client.precise_bn:
            trainer.recompute_batchnorm(keep=shared.keys())
        result = trainer.evaluate()
        seconds = time.perf_counter() - start
        # a model loaded from what was sent is checked; otherwise it is one already checked (trained, a checkpoint)
        how = "with what it was sent" if shared is not None else None
        leaving = Leaving(self.site.hospital, server_round, loaded.model, loaded.keys, how=how, loss=result.loss)
        run_outbound(EVALUATED_RULES, leaving)
        _write_predictions(loaded, trainer, result, server_round)
        self._save(loaded, server_round, EVALUATED)
        self._export(loaded, server_round)
        metrics: dict[str, float | None] = {"loss": result.loss, "acc": result.acc, "auc": result.auc}
        return EvaluateReply(self.site.hospital, loaded.data.num_test, metrics, seconds)

    # -- state -----------------------------------------------------------------------------------------------------
    def _load(self, run_id: str) -> _Loaded:
        if self._loaded is not None and self._loaded.run_id == run_id:
            return self._loaded
        store = self._store(run_id)
        record_path = store.record_path
        if not record_path.is_file():
            raise FederationError(f"hospital {self.site.hospital} was not told about run {run_id} (no Hello)")
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
            run_id, config, data[own], model, policy, keys, store, first if isinstance(first, int) else None
        )
        return self._loaded

    def _ledger(self, loaded: _Loaded) -> Accountant:
        """The run's privacy ledger, checked against its anchor (`federation.hospital.store.RunStore.ledger`)."""
        return loaded.store.ledger(loaded.first_checkpoint, loaded.config.privacy.enabled)

    def _restore(self, loaded: _Loaded, server_round: int, *, inclusive: bool) -> None:
        """Put the model at the newest checkpoint of a round before ``server_round`` (or at it, ``inclusive``)."""
        saved = loaded.store.checkpoints()
        usable = [r for r in saved if r < server_round or (inclusive and r == server_round)]
        if not usable:
            first = loaded.first_checkpoint
            if first is not None and first < server_round:
                # it has trained in this run, yet no checkpoint before this round is left: starting again from the
                # initial model would give other numbers without a word
                raise FederationError(
                    f"hospital {self.site.hospital} has no checkpoint before round {server_round} of run "
                    f"{loaded.run_id}, although it saved one for round {first}: its checkpoints in "
                    f"{loaded.store.folder / CHECKPOINT_DIR} were removed; restore them, or start a new run"
                )
            if loaded.at != (0, EVALUATED):
                initial, _ = initial_state(loaded.config, len(loaded.data.classes))
                loaded.model.load_state_dict(initial)
                loaded.at = (0, EVALUATED)
            return
        newest = max(usable)
        path = saved[newest]
        stage, metadata = loaded.store.checkpoint_stage(path)
        if loaded.at == (newest, stage):
            return
        loaded.model.load_state_dict(loaded.store.read_checkpoint(path, metadata))
        loaded.at = (newest, stage)

    def _save(self, loaded: _Loaded, server_round: int, stage: int) -> None:
        """Checkpoint the model as round ``server_round`` at ``stage``, note the run's first checkpoint in
        ``hospital.json``, and drop checkpoints the run no longer keeps."""
        try:
            loaded.store.save_checkpoint(loaded.model, server_round, stage)
        except FederationError:  # the write failed (a full disk, for one): what this process holds is unknown
            self._loaded = None
            raise
        loaded.at = (server_round, stage)
        if loaded.first_checkpoint is None:  # once per run, kept in hospital.json for a later process
            loaded.store.update_record(first_checkpoint=server_round)
            loaded.first_checkpoint = server_round
        # one more than the server keeps: it may be a round ahead
        loaded.store.prune(server_round, loaded.config.run.keep_checkpoints + 1)

    def _export(self, loaded: _Loaded, server_round: int) -> None:
        """The model bundle the hospital would deploy after ``server_round`` (`federation.hospital.export.
        export_round`): replaced as one, and only once everything it says is known."""
        from federation.hospital.export import export_round

        export_round(
            loaded.store.folder,
            config=loaded.config,
            model=loaded.model,
            data=loaded.data,
            dataset=self.site.dataset,
            hospital=self.site.data_index,
            run_id=loaded.run_id,
            server_round=server_round,
            read_ledger=lambda: self._ledger(loaded),
        )
