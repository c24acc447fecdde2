"""What the server says about a run while it runs, for whoever watches it (the dashboard, ``gastric-fl report``).

``summary.json`` (``RunSummary``): the run's settings, the code that trained it and the machine it trained on (an
in-process or simulated run: ``federation.provenance.machine``), its status (``running``,
``stopped``, ``failed``, ``finished``) and error, its hospitals and classes, the rounds done with the seconds per
round and the ETA, and the figures of ``metrics.jsonl`` so far (final, best, values per round:
``federation.round_figures``). It is rewritten whole at every checkpoint and when the run ends; a resume refused
before its first round puts it back as it was. ``progress.json`` (``RoundPhases``): the current round's phase and how
many of the hospitals asked have answered (``federation.progress``).
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Any

from federation.config import RunConfig
from federation.derived import resolve_device
from federation.jsonl import read_jsonl
from federation.progress import RoundProgress, now, write_progress
from federation.provenance import add_distinct, code_version, machine
from federation.round_figures import round_stats, run_figures
from federation.runfiles import SUMMARY_FILE
from federation.runs import now_iso, write_json
from infra.pids import process_start_time


class RunSummary:
    """``summary.json`` of the run in ``run_dir`` of ``total_rounds`` rounds: ``data`` in memory, written whole."""

    def __init__(self, run_dir: Path, total_rounds: int) -> None:
        self.path = run_dir / SUMMARY_FILE
        self.total_rounds = total_rounds
        self.data: dict[str, Any] = {}
        self.round_seconds: list[float] = []  # of the rounds this process completed, for the ETA

    def start(
        self, config: RunConfig, run_id: str, pid: int, *, resume: bool, restart: bool, dataset_sha256: str | None
    ) -> None:
        """The run's settings and status ``running`` in process ``pid``, over what ``data`` holds (a resumed run's
        summary, or nothing); written by the next ``write``. ``restart``: a resume that starts again at round 1."""
        self.data.update(
            run_id=run_id,
            status="running",
            pid=pid,
            pid_started=process_start_time(pid),
            total_rounds=config.run.rounds,
            rounds_done=self.data.get("rounds_done", 0),
            eta_seconds=None,
            error=None,
            finished_at=None,
            strategy=config.strategy.name,
            model=config.model.name,
            nhead=config.strategy.nhead,
            dataset=config.data.path,
            engine=config.run.engine,
        )
        if dataset_sha256 is not None:
            self.data["dataset_sha256"] = dataset_sha256
        # The commit(s) of the code that trained this run (a resume on other code adds its own).
        recorded = None if restart else self.data.get("code_versions")
        self.data["code_versions"] = add_distinct(recorded, code_version())
        if config.run.engine != "flower":  # the hospitals train on this machine (a deployment's train elsewhere)
            machines = None if restart else self.data.get("machines")
            self.data["machines"] = add_distinct(machines, machine(str(resolve_device(config.run.device))))
        self.data.setdefault("started_at", now_iso())
        if resume:
            self.data["resumed_at"] = now_iso()

    def write(self, **changes: Any) -> None:
        """Apply ``changes`` and rewrite ``summary.json`` (with ``updated_at``)."""
        self.data.update(changes, updated_at=now_iso())
        write_json(self.path, self.data)

    def write_quietly(self, **changes: Any) -> None:
        """``write`` while already failing: a write fault here (a full disk) must not hide the first one."""
        with suppress(OSError):
            self.write(**changes)

    def restore(self, previous: dict[str, Any]) -> None:
        """Put back the summary the run had before this process started (``previous``; nothing to write if empty)."""
        self.data = dict(previous)
        if previous:
            with suppress(OSError):
                write_json(self.path, previous)

    def add_figures(self, metrics: Path) -> None:
        """The figures of ``metrics`` (the run's ``metrics.jsonl``) so far, in memory: the next write carries them
        (the round's, the final one's, or a failure's)."""
        self.data.setdefault("seconds_per_round", None)
        self.data.update(run_figures(round_stats(read_jsonl(metrics))))

    def round_done(self, server_round: int, seconds: float) -> None:
        """Round ``server_round`` is checkpointed after ``seconds``: the summary's progress and ETA, written."""
        self.round_seconds.append(seconds)
        per_round = sum(self.round_seconds) / len(self.round_seconds)
        self.write(
            rounds_done=server_round,
            seconds_per_round=per_round,
            eta_seconds=per_round * (self.total_rounds - server_round),
        )


class RoundPhases:
    """``progress.json`` of the run in ``run_dir``: which phase of which round it is in, and how many of the
    hospitals asked have answered so far."""

    def __init__(self, run_dir: Path, total_rounds: int) -> None:
        self.run_dir = run_dir
        self.total_rounds = total_rounds
        self._phase: tuple[int, str, int, int] | None = None  # round, phase, asked, done

    def begin(self, server_round: int, phase: str, asked: int, done: int = 0) -> None:
        """Rewrite ``progress.json``: ``done`` of ``asked`` hospitals have answered in ``phase`` of this round."""
        self._phase = (server_round, phase, asked, done)
        write_progress(self.run_dir, RoundProgress(server_round, self.total_rounds, phase, done, asked, now()))

    def answered(self, hospital: int) -> None:
        """A hospital answered (the pool tells as it happens): one more done in the current phase."""
        if self._phase is None:  # nothing asked yet
            return
        server_round, phase, asked, done = self._phase
        self.begin(server_round, phase, asked, min(done + 1, asked))
