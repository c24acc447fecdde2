"""The waits a deployed round pays that are ours to set (issue: a deployed round costs about what its training
costs): the ServerApp pulls replies with a short, growing interval instead of Flower's fixed 3 s, and the operator
follows the run through its run directory, asking Flower (a ``flwr ls`` process each time) only now and then.

Both run here against fakes on a fake clock, so that the number of pulls and of ``flwr ls`` calls is exact."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity
from support.checks import every

from federation.config import load_config
from federation.errors import FederationError
from federation.flower import apps, runner, waits
from federation.flower.flwr_cli import COMPLETED, FlwrCli
from federation.flower.records import to_record
from federation.wire.codec import encode
from federation.wire.contract import EvaluateReply, EvaluateTask, Failure


class Clock:
    """``time.monotonic`` and ``time.sleep`` of a module, on a clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Meta:
    reply_to_message_id: str


@dataclass
class Reply:
    metadata: Meta


@dataclass
class FakeGrid:
    """Replies to message ``i`` become available ``answer_at[i]`` seconds after the push."""

    clock: Clock
    answer_at: list[float]
    pulls: int = 0
    delivered: set[str] = field(default_factory=set)

    def push_messages(self, messages: Iterable[object]) -> list[str]:
        return [f"m{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, ids: Iterable[str]) -> list[Reply]:
        self.pulls += 1
        ready = [i for i in ids if self.clock.now >= self.answer_at[int(i[1:])] and i not in self.delivered]
        self.delivered.update(ready)
        return [Reply(Meta(i)) for i in ready]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(apps, "time", fake)
    monkeypatch.setattr(runner, "time", fake)
    return fake


def test_replies_are_pulled_soon_after_they_arrive(clock: Clock) -> None:
    grid = FakeGrid(clock, answer_at=[2.0, 5.0, 5.2])
    replies = apps.exchange(cast(Any, grid), [object(), object(), object()], timeout=60.0)
    assert sorted(r.metadata.reply_to_message_id for r in cast(list[Reply], replies)) == ["m0", "m1", "m2"]
    # the last reply came at 5.2 s: seen within the longest wait, not at Flower's next 3 s pull (6 s)
    assert 5.2 <= clock.now <= 5.2 + waits.LAST_WAIT
    assert clock.sleeps[0] == waits.FIRST_WAIT
    assert max(clock.sleeps) <= waits.LAST_WAIT
    # the wait grows while nothing comes: a 5 s round costs about a dozen pulls, not one every 0.05 s
    assert grid.pulls < 25


def test_a_silent_hospital_is_waited_for_until_the_timeout_only(clock: Clock) -> None:
    grid = FakeGrid(clock, answer_at=[1.0, 1e9])
    replies = apps.exchange(cast(Any, grid), [object(), object()], timeout=30.0)
    assert [r.metadata.reply_to_message_id for r in cast(list[Reply], replies)] == ["m0"]
    assert clock.now == pytest.approx(30.0)
    assert grid.pulls <= 30.0 / waits.LAST_WAIT + 12


@dataclass
class FakeCli:
    """``run_status`` as ``flwr ls`` would answer, counted; the ServerApp writes the run directory on the clock."""

    clock: Clock
    run_dir: Path
    rounds_at: list[float]  # when each round's summary is written
    exit_at: float  # when the ServerApp process has exited after writing "finished"
    calls: list[float] = field(default_factory=list)

    def run_status(self, run_id: int) -> str:
        self.calls.append(self.clock.now)
        return COMPLETED if self.clock.now >= self.exit_at else "running"

    def write(self) -> None:
        done = sum(1 for t in self.rounds_at if self.clock.now >= t)
        status = "finished" if done == len(self.rounds_at) else "running"
        text = json.dumps({"rounds_done": done, "status": status, "updated_at": f"t{done}"})
        (self.run_dir / "summary.json").write_text(text)


def test_the_operator_follows_the_run_directory_and_asks_flower_rarely(clock: Clock, tmp_path: Path) -> None:
    config = load_config(None, ["run.rounds=3"])
    cli = FakeCli(clock, tmp_path, rounds_at=[20.0, 45.0, 70.0], exit_at=71.5)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "updated_at": "earlier attempt"}))
    sleep = clock.sleep

    def sleep_and_write(seconds: float) -> None:
        sleep(seconds)
        cli.write()

    clock.sleep = sleep_and_write  # type: ignore[method-assign]
    limit = runner.time_limit(config.flower, config.run.rounds)
    status = runner.follow(cast(FlwrCli, cli), 7, tmp_path, rounds=config.run.rounds, limit=limit, progress=False)
    assert status == COMPLETED
    # the old run's "failed" summary is not taken for this run's end; Flower is asked every ASK_FLOWER_EVERY
    # seconds while the run goes on, then each second after the summary says finished
    assert cli.calls[0] == pytest.approx(runner.ASK_FLOWER_EVERY)
    assert cli.calls[1] == pytest.approx(2 * runner.ASK_FLOWER_EVERY)
    assert len(cli.calls) >= 3  # at least one call after the summary said finished
    assert every(t >= 70.0 for t in cli.calls[2:])
    assert len(cli.calls) <= 2 + 3
    assert 71.5 <= clock.now <= 73.0


def test_a_run_that_did_not_complete_is_explained_by_its_summary_or_the_serverapps_log(tmp_path: Path) -> None:
    cli = cast(FlwrCli, SimpleNamespace(run_log=lambda run_id: "INFO : started\nValueError: no hospital answered\n"))
    failure = runner._failure(cli, 7, tmp_path, "finished:failed")
    assert str(failure) == "the Flower run 7 ended finished:failed: ValueError: no hospital answered"
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "error": "strategy.nhead = 9 is too big"}))
    assert str(runner._failure(cli, 7, tmp_path, "finished:failed")) == "strategy.nhead = 9 is too big"
    (tmp_path / "summary.json").write_text("{cut off")
    assert runner._summary(tmp_path) == {}  # while the run is followed: read again at the next look
    with pytest.raises(FederationError, match=r"summary.json is not valid JSON \(Expecting property name"):
        runner._failure(cli, 7, tmp_path, "finished:failed")


@dataclass
class ErrorInfo:
    reason: str


@dataclass
class Answer:
    """A reply as Flower's grid gives it: the message it answers, its sender, and content or an error."""

    metadata: Any
    content: Any = None
    error: ErrorInfo | None = None

    def has_error(self) -> bool:
        return self.error is not None


@dataclass
class AnsweringGrid:
    """Node 11 answers; node 22 is held unavailable, so the SuperLink answers for it (sender: the SuperLink)."""

    replies: list[Answer] = field(default_factory=list)

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        ids = []
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{i}"  # as Flower's grid does on push
            ids.append(f"m{i}")
            if message.metadata.dst_node_id == 11:
                reply = encode(EvaluateReply(0, 4, {"loss": 0.5, "acc": 1.0, "auc": None}))
                self.replies.append(
                    Answer(SimpleNamespace(reply_to_message_id=f"m{i}", src_node_id=11), to_record(reply))
                )
            else:
                unavailable = "Error: Node Unavailable - The destination node failed to report a heartbeat"
                meta = SimpleNamespace(reply_to_message_id=f"m{i}", src_node_id=SUPERLINK_NODE_ID)
                self.replies.append(Answer(meta, error=ErrorInfo(unavailable)))
        return ids

    def pull_messages(self, ids: Iterable[str]) -> list[Answer]:
        wanted = set(ids)
        out = [r for r in self.replies if r.metadata.reply_to_message_id in wanted]
        self.replies = [r for r in self.replies if r not in out]
        return out

    def get_node_ids(self) -> list[int]:
        return [11, 22]


def test_a_reply_the_superlink_gives_for_an_unavailable_hospital_is_that_hospitals(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # replies are matched to hospitals by the message they answer: the SuperLink's error reply for hospital 1 is
    # hospital 1's (silent: it never got the task), not "no answer within the round timeout"
    for name in ("_run_id", "_task_id", "_node_id"):  # what a ServerApp process has set when it makes messages
        monkeypatch.setattr(TaskIdentity, name, 7)
    pool = apps.FlowerPool(cast(Any, AnsweringGrid()), hospitals=2, connect_timeout=5, round_timeout=60)
    pool.node_of = {0: 11, 1: 22}
    task = EvaluateTask("run", 1, 0, [], None)
    out = pool.exchange({0: task, 1: dataclasses.replace(task, client=1)})
    assert isinstance(out[0], EvaluateReply)
    assert isinstance(out[1], Failure)
    assert out[1].silent
    assert out[1].reason.startswith("the SuperLink could not deliver to it: Error: Node Unavailable")
    assert clock.now < 1.0  # nobody was waited for until the timeout
