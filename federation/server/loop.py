"""The server: the only round loop, for every strategy and every transport (FedSAF paper 001, Algorithm 1).

Before round 1 the server says ``Hello`` to every hospital the pool reaches; each answers with its client index,
tile counts and its dataset's class names (the server never reads a hospital's manifest). The class names fix the
model's number of outputs: every hospital must report the same list (else the run stops with one line before
the first round); ``summary.json`` records it as ``classes`` and a resume must find the same list again.
Every round: ``configure_train`` -> each hospital trains on what it was sent -> ``aggregate_train`` over the
usable replies -> ``configure_evaluate`` -> each hospital evaluates its model (shared part as sent + its own
head) on its own test split. Values sent and received per hospital are counted from the messages
(``federation.wire.contract``). A round costs one message per hospital: a strategy that deploys each hospital's own
model
(``evaluates_own``) gets the evaluation in the training reply; one that deploys what it sends next
(``evaluates_next_start``: the averaging family) gets round r's evaluation with round r+1's training, and after the
last round asks for it on its own. Round r's record (``federation.server.rounds.RoundRecord``) then waits in round
r's checkpoint until its evaluation comes, and is written as an uninterrupted run with separate messages would.

Faults: a hospital that fails, does not answer within the transport's timeout, or sends a reply the server cannot
believe (tensors that are not finite or not exactly the shared keys...: ``federation.server.checks``) is left out of
that round's aggregation (``left_out`` in ``aggregation.jsonl`` and on the progress line) and takes part again in the
next round; so is one whose update makes the aggregate overflow (``federation.server.guard``: the round is aggregated
again without it). A hospital whose Hello declares counts that are not counts (or above ``server.max_examples``) is
left out of the whole run, in one warning line. A round with no usable reply stops the run with a one-line reason
naming every hospital and why; the checkpoint of the previous round stays, so ``--resume`` continues. What a left-out
reply carried (its counts, its metrics) never reaches ``metrics.jsonl``: a hospital evaluated in a round whose
training of it was left out has ``trained: false`` and ``num_train: 0``.

The server's run directory holds only what messages carried: ``config.toml``, ``metrics.jsonl`` (scalars and
counts per round and hospital), ``aggregation.jsonl``, ``summary.json``, ``progress.json`` (the current round's
phase and how many hospitals have answered: ``federation.progress``) and checkpoints of the strategy's state
(shared tensors only); ``summary.json`` and ``progress.json`` are written by ``federation.server.summary``.
Hospitals keep their own folders (``federation.hospital.handler``); this module never reads them.

The run directory's lifecycle (issue 10, docs/reliability.md): the whole run holds the folder's lock
(``infra.outputs.claim_output``), so two ``train`` into one folder cannot interleave; the folder carries train's
ownership marker (``federation.runs.prepare_run_dir``). Settings that cannot work are refused before the folder
exists; an error before the first checkpoint leaves a run that ``--resume`` may restart with any corrected setting.
A resume (``federation.server.resume``) checks the dataset's manifest hash (``dataset_sha256``, given by the
launcher), removes temp files of a killed write, names damaged lines of the run files and redoes their round, and
falls back to the previous readable checkpoint (with a warning) when the latest cannot be read; a resume refused
before its first round leaves ``summary.json`` as it was. Write faults (full disk, read-only file system) are one
line.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from federation.config import RunConfig, config_to_toml, resolve_config
from federation.derived import NUM_CLASSES, derive_seed, initial_weights
from federation.errors import FederationError, Interrupted, first_line
from federation.runfiles import AGGREGATION_FILE, CONFIG_FILE, METRICS_FILE
from federation.runs import (
    OWNER,
    append_jsonl,
    complete_checkpoints,
    now_iso,
    prepare_run_dir,
)
from federation.server.audit import ANCHORS_FILE, AUDIT_FILE, Anchors, AuditLog
from federation.server.checks import agreed_classes, evaluation_problem, take_previous, train_problem
from federation.server.dp_watch import DpWatch
from federation.server.guard import aggregate_or_leave_out
from federation.server.pool import Pool
from federation.server.resume import continue_run, open_for_resume
from federation.server.roster import check_same_classes, check_same_hospitals, roster
from federation.server.rounds import RoundRecord, no_round, save_checkpoint
from federation.server.summary import RoundPhases, RunSummary
from federation.strategies import StrategyContext, bn_mode, build_strategy
from federation.wire.codec import Message
from federation.wire.contract import (
    EvaluateReply,
    EvaluateTask,
    Failure,
    Hello,
    Strategy,
    TrainReply,
    TrainTask,
    count_reply_values,
    count_values,
)
from infra.outputs import OutputError, claim_output, os_error_message, terminate_as_interrupt, write_atomic
from models import batchnorm_keys, check_input_size, check_nhead, create_model

PoolFactory = Callable[[], Pool]


class RunStopped(Interrupted):
    """The run was interrupted (Ctrl-C or SIGTERM); ``summary.json`` says ``stopped``."""


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def local_keys(config: RunConfig, num_classes: int = NUM_CLASSES) -> frozenset[str]:
    """What stays at every hospital whatever ``nhead``: BatchNorm keys under ``strategy.bn`` (or the method's own
    choice, e.g. FedBN's), the same for every method."""
    mode = bn_mode(config.strategy.name, config.strategy.bn)
    if mode == "shared":
        return frozenset()
    model = create_model(config.model.name, num_classes, config.model.in_chans, norm=config.model.norm)
    return frozenset(batchnorm_keys(model, affine=mode == "local"))


class Server:
    """The server of one run of the federation into ``run_dir`` (fresh, or resumed from its last checkpoint): it runs
    the rounds over the hospitals a pool reaches (``run``)."""

    def __init__(self, config: RunConfig, run_dir: Path, *, progress: bool = True) -> None:
        self.config = resolve_config(config)
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.progress = progress
        self.summary = RunSummary(run_dir, self.config.run.rounds)
        self.phases = RoundPhases(run_dir, self.config.run.rounds)
        # sha256 of the dataset's manifest.csv, set by a launcher that reads the dataset (the local engines);
        # recorded in summary.json and compared on resume. None: the hospitals are elsewhere (they check it).
        self.dataset_sha256: str | None = None
        self.warn: Callable[[str], None] = _warn
        self.restart = False
        self.rounds_run = 0  # rounds completed by this process

    def run(self, make_pool: PoolFactory, *, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Train every round; returns the final ``summary.json`` content. Raises on failure or interruption.

        The run directory is locked for the whole run; a write fault is one line naming the path (exit 2).
        """
        flag = "--resume" if resume else "--out"
        try:
            with claim_output(self.run_dir, OWNER, flag=flag):
                return self._run(make_pool, resume, overwrite)
        except OutputError as exc:
            raise FederationError(str(exc)) from None
        except OSError as exc:
            raise FederationError(os_error_message(exc, self.run_dir, flag)) from None

    def _run(self, make_pool: PoolFactory, resume: bool, overwrite: bool) -> dict[str, Any]:
        config = self.config
        summary = self.summary
        # Settings that cannot work are refused before the run directory is created or touched.
        check_input_size(config.model.name, config.data.input_size)
        self._initial = initial_weights(config.model, config.run.seed)
        check_nhead(config.strategy.nhead or 0, self._initial[1])
        previous: dict[str, Any] = {}
        if resume:
            previous, self.restart = open_for_resume(self.run_dir, config.data.path, self.dataset_sha256, self.warn)
            summary.data = dict(previous)
        else:
            prepare_run_dir(self.run_dir, overwrite)
        summary.start(
            config, self.run_id, os.getpid(), resume=resume, restart=self.restart, dataset_sha256=self.dataset_sha256
        )
        write_atomic(self.run_dir / CONFIG_FILE, config_to_toml(config).encode("utf-8"))
        summary.write()
        pool: Pool | None = None
        threads_before = torch.get_num_threads()
        if config.run.threads > 0:
            torch.set_num_threads(config.run.threads)
        try:
            # SIGTERM unwinds the run like Ctrl-C (infra.outputs.Terminated, "stopped by SIGTERM"): marked stopped
            with terminate_as_interrupt((signal.SIGTERM,), take_over=True):
                pool = make_pool()
                if config.run.audit:
                    pool.observers.append(AuditLog(self.run_dir / AUDIT_FILE))
                pool.anchors = Anchors(self.run_dir / ANCHORS_FILE, self.run_id)  # every hospital's outbound head
                self._start(pool, resume and not self.restart)
                self._loop(pool)
        except (KeyboardInterrupt, RunStopped) as exc:
            summary.write_quietly(status="stopped", eta_seconds=None, error=str(exc) or "interrupted")
            raise RunStopped(
                f"stopped after round {summary.data.get('rounds_done', 0)}; "
                f"continue with: gastric-fl train --resume {self.run_dir}"
            ) from exc
        except Exception as exc:
            message = first_line(exc)
            if resume and not self.restart and self.rounds_run == 0:
                # A resume refused before its first round (another dataset, a damaged hospital...) changed
                # nothing: the run keeps the status it had (a finished run stays finished).
                summary.restore(previous)
                raise
            if not complete_checkpoints(self.run_dir) and getattr(exc, "user_facing", False):
                message += (
                    f"; no round was completed, so any setting may still change: continue with gastric-fl train "
                    f"--resume {self.run_dir} --set KEY=VALUE"
                )
                summary.write_quietly(status="failed", eta_seconds=None, error=message)
                raise FederationError(message) from exc
            summary.write_quietly(status="failed", eta_seconds=None, error=message)
            raise
        finally:
            if pool is not None:
                pool.close()
            torch.set_num_threads(threads_before)
        summary.write(status="finished", eta_seconds=0, finished_at=now_iso())
        return summary.data

    # -- before round 1 ----------------------------------------------------------------------------------------------
    def _start(self, pool: Pool, resume: bool) -> None:
        config = self.config
        replies = pool.hello(Hello(self.run_id, config_to_toml(config), resume))
        hospitals, hellos, refused = roster(
            replies, config.strategy.clients, config.server.max_examples, self.run_id, self.warn
        )
        summary = self.summary.data
        if refused:
            summary["left_out_at_hello"] = {str(c): r for c, r in refused.items()}
        if resume:
            check_same_hospitals(summary, self.run_dir, hospitals)
        self.classes = agreed_classes({c: hellos[c] for c in hospitals})
        if resume:
            check_same_classes(summary, self.run_dir, self.classes)
        self.counts = {c: hellos[c].num_train for c in hospitals}
        self.num_test = {c: hellos[c].num_test for c in hospitals}
        if len(self.classes) != NUM_CLASSES:  # the early checks used the binary model; the outputs differ
            self._initial = initial_weights(config.model, config.run.seed, len(self.classes))
        initial, units = self._initial
        self.spec = {k: (tuple(v.shape), v.dtype) for k, v in initial.items()}
        ctx = StrategyContext(
            hospitals, self.counts, tuple(initial), tuple(units), initial, local_keys(config, len(self.classes))
        )
        self.strategy: Strategy = build_strategy(config, ctx)
        self.shared_keys = self.strategy.shared_keys(list(initial), [keys for _, keys in units])
        self.hospitals = hospitals
        self.start_round = 1
        self.pending: RoundRecord | None = None  # a round whose evaluation is still to come
        # each DP hospital's epsilon and steps so far, which must grow round by round (federation.server.dp_watch)
        self.dp_watch = DpWatch.from_metrics(self.run_dir / METRICS_FILE) if resume else DpWatch()
        if resume:
            self.start_round, self.pending = continue_run(self.run_dir, hospitals, self.strategy, self.warn)
            summary["rounds_done"] = self.start_round - 1
        else:
            for name in (METRICS_FILE, AGGREGATION_FILE):
                (self.run_dir / name).write_text("", encoding="utf-8")
        summary["clients"] = list(hospitals)
        summary["classes"] = list(self.classes)

    # -- the rounds ---------------------------------------------------------------------------------------------------
    def _loop(self, pool: Pool) -> None:
        total = self.config.run.rounds
        bar = tqdm(
            total=total,
            initial=self.start_round - 1,
            desc=self.run_id,
            unit="round",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        self.bar = bar
        pool.on_answer = self.phases.answered
        try:
            for server_round in range(self.start_round, total + 1):
                self._round(pool, server_round)
                self.rounds_run += 1
                bar.update(1)
                final = self.summary.data.get("final") or {}
                bar.set_postfix(acc=f"{final.get('avg_test_acc', 0):.3f}")
            self._finish(pool)
        finally:
            bar.close()

    def _note(self, text: str) -> None:
        if self.progress:
            self.bar.write(text)

    def _round(self, pool: Pool, server_round: int) -> None:
        config = self.config
        start = time.perf_counter()
        previous = self.pending  # the last round, when its evaluation rides with this round's training
        instructions = self.strategy.configure_train(server_round, self.hospitals)
        record = RoundRecord(server_round, sent={c: count_values(i) for c, i in instructions.items()}, started=start)
        # a strategy that deploys each hospital's own model gets the evaluation with the training: one message
        fused = self.strategy.evaluates_own
        ask_previous = set(previous.to_evaluate(self.hospitals)) if previous is not None else set()
        tasks = {
            c: TrainTask(
                self.run_id,
                server_round,
                derive_seed(config.run.seed, server_round, c),
                self.shared_keys,
                i,
                fused,
                c in ask_previous,
            )
            for c, i in instructions.items()
        }
        self.phases.begin(server_round, "training", len(tasks))
        replies = pool.exchange(tasks)
        if previous is not None:
            self._previous_evaluations(pool, previous, {c: replies[c] for c in ask_previous if c in replies})
            self._write_record(previous, until=start)
            self.pending = None
        trained: dict[int, TrainReply] = {}
        for c, reply in replies.items():
            fisher = tasks[c].instruction.recipe.fisher_batch > 0
            reason = train_problem(c, reply, self.shared_keys, self.spec, self.counts, fisher)
            if reason is None and isinstance(reply, TrainReply):
                trained[c] = reply
                record.add_trained(c, reply)
            else:
                record.leave_out(
                    c, reason or "unexpected reply", diverged=isinstance(reply, Failure) and reply.diverged
                )
                if isinstance(reply, Failure) and reply.silent:
                    record.silent.add(c)
        if instructions and not trained:
            raise no_round(
                server_round, "sent a usable update", record.left_out, record.diverged, config.client.lr, self.run_dir
            )
        self.phases.begin(server_round, "aggregating", len(trained))
        # a reply whose update makes the aggregate overflow is left out and the round aggregated without it
        record.aggregation, dropped = aggregate_or_leave_out(self.strategy, server_round, trained)
        for c, reason in dropped.items():
            del trained[c]
            del record.trained[c]
            record.leave_out(c, reason)
        if instructions and not trained:
            # every update overflowing the aggregate is what a diverging training looks like: advise as for one
            overflowed = record.diverged | {str(c) for c in dropped}
            raise no_round(
                server_round,
                "sent an update that could be aggregated",
                record.left_out,
                overflowed,
                config.client.lr,
                self.run_dir,
            )
        record.received = {c: count_reply_values(t) for c, t in trained.items()}
        flags = self.dp_watch.check(server_round, {c: t.metrics for c, t in trained.items()})
        if flags:  # named, and aggregated all the same: the noise was as asked, the account is what is wrong
            record.aggregation["dp_not_growing"] = flags
            for message in flags.values():
                self.warn(message)
        for c, t in trained.items():
            if fused and t.evaluation is not None:
                problem = evaluation_problem(t.evaluation, self.num_test.get(c))
                if problem is None:
                    record.evaluated[c] = t.evaluation
                else:  # its training was usable; its evaluation is not recorded
                    record.leave_out(c, problem, evaluation=True)
        if self.strategy.evaluates_next_start and not fused:
            # the evaluation comes with the next round's training (or, after the last round, on its own): the
            # record waits in the checkpoint
            record.seconds = time.perf_counter() - start
            self._checkpoint(record, pending=True)
            self.pending = record
            self.summary.round_done(record.round, record.seconds)
            return
        self._evaluate(pool, record, record.to_evaluate(self.hospitals))
        self._write_record(record, until=None)
        self._checkpoint(record, pending=False)
        self.summary.round_done(record.round, time.perf_counter() - start)

    def _previous_evaluations(self, pool: Pool, record: RoundRecord, replies: Mapping[int, Message]) -> None:
        """Take ``record``'s evaluations from the combined replies (``TrainReply.previous``); a hospital whose
        combined message failed (other than by silence) or came back without one is asked on its own, so that a
        refused or failed training does not lose the evaluation of the round before."""
        self._evaluate(pool, record, take_previous(record, replies, self.num_test))

    def _evaluate(self, pool: Pool, record: RoundRecord, hospitals: list[int]) -> None:
        """Ask ``hospitals`` for ``record``'s evaluation, each an ``EvaluateTask`` with what the strategy deploys."""
        if not hospitals:
            return
        shared = self.strategy.configure_evaluate(record.round, hospitals)
        tasks = {c: EvaluateTask(self.run_id, record.round, c, self.shared_keys, shared.get(c)) for c in hospitals}
        self.phases.begin(record.round, "evaluating", len(tasks))
        for c, reply in pool.exchange(tasks).items():
            problem = evaluation_problem(reply, self.num_test.get(c)) if isinstance(reply, EvaluateReply) else None
            if isinstance(reply, EvaluateReply) and problem is None:
                record.evaluated[c] = reply
            else:
                reason = reply.reason if isinstance(reply, Failure) else problem or "unexpected reply"
                record.leave_out(c, reason, evaluation=True, diverged=isinstance(reply, Failure) and reply.diverged)

    def _write_record(self, record: RoundRecord, until: float | None) -> None:
        """Append the round's lines to ``metrics.jsonl`` and ``aggregation.jsonl`` and update the summary's figures;
        a round no hospital could evaluate stops the run. Its ``seconds``: from its start until ``until`` (the next
        round's start) or now, or, after a resume, its time up to its checkpoint."""
        if not record.evaluated:
            lr = self.config.client.lr
            raise no_round(record.round, "could evaluate", record.left_out, record.diverged, lr, self.run_dir)
        for who, why in record.left_out.items():
            self._note(f"round {record.round}: hospital {who} left out ({why})")
        # who the latest round did without, and why: the run's end names them (federation.server.summary)
        self.summary.data["left_out"] = record.left_out_lines()
        if record.started is None:
            seconds = record.seconds
        else:
            seconds = (until if until is not None else time.perf_counter()) - record.started
        append_jsonl(self.run_dir / METRICS_FILE, record.metrics_lines(self.hospitals, self.counts))
        append_jsonl(self.run_dir / AGGREGATION_FILE, [record.aggregation_line(seconds)])
        self.summary.add_figures(self.run_dir / METRICS_FILE)

    def _checkpoint(self, record: RoundRecord, *, pending: bool) -> None:
        save_checkpoint(self.run_dir, record, self.hospitals, self.strategy, self.config.run.keep_checkpoints, pending)

    def _finish(self, pool: Pool) -> None:
        """After the last round: the evaluation still to come (``evaluates_next_start``) on its own."""
        record = self.pending
        if record is None:
            return
        self._evaluate(pool, record, record.to_evaluate(self.hospitals))
        self._write_record(record, until=None)
        self.pending = None
        self.summary.write()
