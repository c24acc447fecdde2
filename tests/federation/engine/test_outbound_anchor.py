"""An outbound record that cannot lose its end (issue 34, item 2), played from the other side.

Two deployed hospitals answer a server through ``InProcessPool`` with the server's ``Anchors`` (``<run>/anchors.json``)
set as the round loop sets it: a hello, a refused task, round 1's training, another refused task and round 1's
evaluation, so each hospital's ``outbound.jsonl`` holds 5 lines and the server's anchor of it says "4 lines, then the
evaluate_reply" (the head a reply carries is the log's *before* its own line). Then the hospital's side tampers with
its log (cut short by 1, 2 or 3 lines, only the first line kept, emptied, its last line edited to read as a refusal,
re-chained after a line was removed, or another hospital's log shown instead) and ``gastric-fl federation audit``
is run with the anchor (broken: exit 1, each problem named with the run, the hospital and the line) and without one
(exit 0, but it says that the end of the log is unchecked).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
from support.cli import run_cli
from support.tiny_dataset import TINY_SETTINGS
from support.trust import RUN, config_of, honest_keys

from federation.config import RunConfig, config_to_toml, load_config
from federation.derived import initial_state
from federation.engine.pools import InProcessPool
from federation.errors import FederationError
from federation.hospital.handler import Site
from federation.hospital.outbound import OUTBOUND_FILE, head_of, read_outbound
from federation.hospital.policy import HospitalPolicy
from federation.launch import train
from federation.server.audit import ANCHORS_FILE, AUDIT_FILE, Anchors, check_message, describe, load_anchor
from federation.server.pool import Pool
from federation.wire.chain import GENESIS, HEAD_FIELD, Head, content_digest, parse_head
from federation.wire.codec import Envelope, encode, envelope_digest
from federation.wire.contract import (
    EvaluateReply,
    EvaluateTask,
    Failure,
    Hello,
    HelloReply,
    Recipe,
    TrainInstruction,
    TrainReply,
    TrainTask,
)

NOT_ANCHORED = "the end of the log cannot be checked without an anchor"
INTACT = "integrity: intact (every line chained to the one before; the log holds its anchor)"


def _task(config: RunConfig, client: int, server_round: int, refused: bool) -> TrainTask:
    initial, _ = initial_state(config)
    keys = honest_keys(config)
    instruction = TrainInstruction(
        client, Recipe(epochs=1, lr=0.01, head_epochs=1), shared={k: initial[k] for k in keys}
    )
    # asking for a head tensor is refused before anything is trained (federation.hospital.policy)
    return TrainTask(RUN, server_round, 7, [*keys, "classifier.3.weight"] if refused else keys, instruction)


@pytest.fixture(scope="module")
def played(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A server (its run folder: ``server/``) and two deployed hospitals (``state_0``, ``state_1``), 5 replies each."""
    root = tmp_path_factory.mktemp("anchored")
    config = config_of(dataset)
    sites = [Site(dataset, c, root / f"state_{c}", per_run=True, policy=HospitalPolicy()) for c in (0, 1)]
    pool = InProcessPool(sites)
    (root / "server").mkdir()
    pool.anchors = Anchors(root / "server" / ANCHORS_FILE, RUN)
    hellos = pool.hello(Hello(RUN, config_to_toml(config)))
    assert sorted(hellos) == [0, 1]
    assert isinstance(hellos[0], HelloReply)
    assert isinstance(hellos[1], HelloReply)
    for refused in (True, False, True):
        replies = pool.exchange({c: _task(config, c, 1, refused) for c in (0, 1)})
        assert len(replies) == 2
        for reply in replies.values():
            assert isinstance(reply, Failure if refused else TrainReply), reply
    keys = honest_keys(config)
    replies = pool.exchange({c: EvaluateTask(RUN, 1, c, keys, None) for c in (0, 1)})
    assert [type(r) for r in replies.values()] == [EvaluateReply, EvaluateReply]
    return root


def _copy(played: Path, tmp_path: Path, client: int = 0) -> tuple[Path, Path]:
    """A copy of hospital ``client``'s state to tamper with, and the server's anchors file."""
    state = tmp_path / f"state_{client}"
    shutil.copytree(played / f"state_{client}", state)
    return state, played / "server" / ANCHORS_FILE


def _audit(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = run_cli(monkeypatch, "federation", "audit", *args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _anchor_problems(output: str) -> list[str]:
    """The problems the audit lists under its anchor heading."""
    lines = output.splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith("INTEGRITY: the log does not hold its anchor")]
    assert len(start) == 1, output
    out = []
    for line in lines[start[0] + 1 :]:
        if not line.startswith("  "):
            break
        out.append(line.strip())
    return out


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines()


def _rechain(lines: list[str]) -> list[str]:
    """Every ``prev`` recomputed, as whoever edits the log would: the chain reads intact again."""
    out, prev = [], GENESIS
    for line in lines:
        record = json.loads(line)
        record["prev"] = prev
        text = json.dumps(record)
        out.append(text)
        prev = hashlib.sha256(text.encode()).hexdigest()
    return out


def test_the_server_keeps_the_head_each_reply_carried_before_its_own_line(played: Path) -> None:
    anchors = json.loads((played / "server" / ANCHORS_FILE).read_text())
    assert anchors["run"] == RUN
    assert sorted(anchors["hospitals"]) == ["0", "1"]
    for c in (0, 1):
        log = played / f"state_{c}" / OUTBOUND_FILE
        data = log.read_bytes()
        lines = data.splitlines()
        assert len(lines) == 5
        entry = anchors["hospitals"][str(c)]
        assert entry["count"] == 4
        assert entry["sha256"] == head_of(b"\n".join(lines[:4]) + b"\n").sha256
        assert entry["kind"] == "evaluate_reply"
        assert entry["replies"] == 5
        last = json.loads(lines[4])
        assert entry["reply_sha256"] == last["sha256"]
        # what the hospital recorded carries the head too, as the scalars of what left
        assert last["scalars"][HEAD_FIELD] == {"count": 4, "sha256": entry["sha256"]}
        assert json.loads(lines[0])["scalars"][HEAD_FIELD] == {"count": 0, "sha256": GENESIS}
        assert read_outbound(log).problems == []


def test_an_honest_log_with_its_anchor_is_intact(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, anchors = _copy(played, tmp_path)
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors), "--hospital", "0")
    assert code == 0, output
    assert INTACT in output
    assert f"anchor: the anchor of run {RUN}, hospital 0 ({anchors})" in output
    assert NOT_ANCHORED not in output
    assert "refused requests: 2" in output
    # an anchor of several hospitals needs --hospital: the log's own records (which its side can edit) never say
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors))
    assert code == 2, output
    assert (
        f"--anchor {anchors} holds hospitals [0, 1] of run {RUN}: name the hospital this log is with --hospital N"
        in output
    )
    state_1, _ = _copy(played, tmp_path, 1)
    code, output = _audit(monkeypatch, capsys, "--state", str(state_1), "--anchor", str(anchors), "--hospital", "1")
    assert code == 0, output
    assert f"anchor: the anchor of run {RUN}, hospital 1 ({anchors})" in output


@pytest.mark.parametrize(
    ("case", "keep", "ends_after"),
    [("cut by 1", 4, 4), ("cut by 2", 3, 3), ("cut by 3", 2, 2), ("only the first line", 1, 1), ("emptied", 0, 0)],
)
def test_a_log_cut_short_is_broken_with_its_anchor_and_unchecked_without(
    played: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
    keep: int,
    ends_after: int,
) -> None:
    state, anchors = _copy(played, tmp_path)
    log = state / OUTBOUND_FILE
    lines = _lines(log)
    assert len(lines) == 5
    log.write_text("".join(f"{line}\n" for line in lines[:keep]))
    code, output = _audit(monkeypatch, capsys, "--state", str(state))
    assert code == 0, output  # nothing inside the file can tell
    assert NOT_ANCHORED in output
    assert "INTEGRITY" not in output
    assert "integrity: intact" not in output
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors), "--hospital", "0")
    assert code == 1, output
    whose = f"the anchor of run {RUN}, hospital 0 ({anchors})"
    how = "it was emptied" if keep == 0 else "lines were removed from its end"
    assert _anchor_problems(output) == [
        f"{log}:{ends_after + 1}: the log ends after {ends_after} line(s), but {whose} holds the evaluate_reply "
        f"recorded as line 5: {how}"
    ], case
    assert INTACT not in output


def test_a_last_line_edited_to_read_as_a_refusal_is_broken_with_its_anchor(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, anchors = _copy(played, tmp_path)
    log = state / OUTBOUND_FILE
    lines = _lines(log)
    last = json.loads(lines[-1])
    reason = "refused by the default hospital policy: nothing left"
    last.update(kind="failure", tensors={}, values=0, reason=reason, refused=True)  # prev and sha256 kept
    log.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    code, output = _audit(monkeypatch, capsys, "--state", str(state))
    assert code == 0, output
    assert NOT_ANCHORED in output
    assert "refused requests: 3" in output  # the edit reads as one more refusal
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors), "--hospital", "0")
    assert code == 1, output
    digest = last["sha256"][:12]
    assert _anchor_problems(output) == [
        f"{log}:5: should record the evaluate_reply (sha256 {digest}...) that the anchor of run {RUN}, hospital 0 "
        f"({anchors}) received, but it records kind failure, refused, run {RUN}, hospital 0, sha256 {digest}...: "
        "the line was edited, or this is another hospital's log"
    ]


def test_a_rechained_log_is_broken_with_its_anchor(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, anchors = _copy(played, tmp_path)
    log = state / OUTBOUND_FILE
    lines = _lines(log)
    del lines[2]  # round 1's training reply removed from the record, every prev recomputed
    log.write_text("\n".join(_rechain(lines)) + "\n")
    assert read_outbound(log).problems == []  # the chain alone reads intact
    code, output = _audit(monkeypatch, capsys, "--state", str(state))
    assert code == 0, output
    assert NOT_ANCHORED in output
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors), "--hospital", "0")
    assert code == 1, output
    whose = f"the anchor of run {RUN}, hospital 0 ({anchors})"
    head = json.loads((played / "server" / ANCHORS_FILE).read_text())["hospitals"]["0"]["sha256"]
    assert _anchor_problems(output) == [
        f"{log}:5: the log ends after 4 line(s), but {whose} holds the evaluate_reply recorded as line 5: lines were "
        "removed from its end",
        f"{log}:4: does not hash to {whose} (sha256 {head[:12]}...): a line up to it was edited or removed and the "
        "chain recomputed, or this is another hospital's log",
    ]


def test_another_hospitals_log_is_broken_with_this_hospitals_anchor(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    other, anchors = _copy(played, tmp_path, 1)
    log = other / OUTBOUND_FILE
    code, output = _audit(monkeypatch, capsys, "--state", str(other))
    assert code == 0, output
    assert NOT_ANCHORED in output
    code, output = _audit(monkeypatch, capsys, "--state", str(other), "--anchor", str(anchors), "--hospital", "0")
    assert code == 1, output
    entry = json.loads(anchors.read_text())["hospitals"]["0"]
    fifth = json.loads(_lines(log)[4])
    whose = f"the anchor of run {RUN}, hospital 0 ({anchors})"
    assert _anchor_problems(output) == [
        f"{log}:4: does not hash to {whose} (sha256 {entry['sha256'][:12]}...): a line up to it was edited or "
        "removed and the chain recomputed, or this is another hospital's log",
        f"{log}:5: should record the evaluate_reply (sha256 {entry['reply_sha256'][:12]}...) that {whose} received, "
        f"but it records kind evaluate_reply, run {RUN}, hospital 1, sha256 {fifth['sha256'][:12]}...: the line was "
        "edited, or this is another hospital's log",
    ]


def test_a_head_the_hospital_noted_anchors_its_log(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = _copy(played, tmp_path)
    log = state / OUTBOUND_FILE
    lines = _lines(log)
    noted = head_of(("\n".join(lines[:3]) + "\n").encode())
    code, output = _audit(monkeypatch, capsys, "--state", str(state))
    assert f"head: 5 lines, sha256 {head_of(log.read_bytes()).sha256}" in output
    given = ["--count", "3", "--sha256", noted.sha256]
    code, output = _audit(monkeypatch, capsys, "--state", str(state), *given)
    assert code == 0, output
    assert INTACT in output
    whose = f"the head given (3 lines, sha256 {noted.sha256[:12]}...)"
    log.write_text("\n".join(lines[:2]) + "\n")  # cut short
    code, output = _audit(monkeypatch, capsys, "--state", str(state), *given)
    assert code == 1, output
    assert _anchor_problems(output) == [
        f"{log}:3: the log ends after 2 line(s), but {whose} holds 3 line(s): lines were removed from its end"
    ]
    log.write_text("\n".join(_rechain([lines[0], *lines[2:]])) + "\n")  # line 2 removed, re-chained
    code, output = _audit(monkeypatch, capsys, "--state", str(state), *given)
    assert code == 1, output
    assert _anchor_problems(output) == [
        f"{log}:3: does not hash to {whose} (sha256 {noted.sha256[:12]}...): a line up to it was edited or removed "
        "and the chain recomputed, or this is another hospital's log"
    ]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--count", "3"], "give --count N and --sha256 H together"),
        (["--count", "-1", "--sha256", "a" * 64], "--count -1 --sha256"),
        (["--count", "3", "--sha256", "xyz"], "is not a head of a log"),
        (["--count", "0", "--sha256", "a" * 64], "is not a head of a log"),
        (["--hospital", "0"], "give the run's anchors.json too"),
    ],
)
def test_a_bad_head_on_the_command_line_is_one_line_exit_2(
    played: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
) -> None:
    state, _ = _copy(played, tmp_path)
    code, output = _audit(monkeypatch, capsys, "--state", str(state), *args)
    assert code == 2, output
    assert words in output
    assert "Traceback" not in output


def test_a_bad_anchor_file_is_one_line_exit_2(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state, anchors = _copy(played, tmp_path)
    bad = tmp_path / "anchors.json"
    bad.write_text("{not json")
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(bad))
    assert code == 2, output
    assert f"--anchor {bad} is not JSON" in output
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors), "--hospital", "7")
    assert code == 2, output
    assert f"--anchor {anchors} holds no head of hospital 7 in run {RUN} (it holds [0, 1])" in output
    (state / OUTBOUND_FILE).write_text("")  # an empty log names no hospital, and the anchor holds two
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors))
    assert code == 2, output
    assert (
        f"--anchor {anchors} holds hospitals [0, 1] of run {RUN}: name the hospital this log is with --hospital N"
        in output
    )
    data = json.loads(anchors.read_text())
    data["hospitals"]["0"]["count"] = "4"
    bad.write_text(json.dumps(data))
    with pytest.raises(FederationError, match="hospital 0's entry is damaged"):
        load_anchor(bad, 0)
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(bad), "--hospital", "0")
    assert code == 2, output
    assert f"--anchor {bad}: hospital 0's entry is damaged (its outbound_head count '4' is not an integer" in output


class _Replies(Pool):
    """A pool whose hospitals send the given replies (a hospital playing tricks with its head)."""

    def __init__(self, replies: Mapping[int, Envelope]) -> None:
        super().__init__()
        self.replies = dict(replies)

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        return {c: self.replies[c] for c in envelopes}


@pytest.mark.parametrize(
    ("head", "words"),
    [
        ({"count": -1, "sha256": "a" * 64}, "count -1 is not an integer >= 0"),
        ({"count": True, "sha256": "a" * 64}, "count True is not an integer >= 0"),
        ({"count": "4", "sha256": "a" * 64}, "count '4' is not an integer >= 0"),
        ({"count": 4.0, "sha256": "a" * 64}, "count 4.0 is not an integer >= 0"),
        ({"count": 4, "sha256": "A" * 64}, "is not 64 hex digits"),
        ({"count": 4, "sha256": "a" * 63}, "is not 64 hex digits"),
        ({"count": 4, "sha256": 7}, "sha256 7 is not 64 hex digits"),
        ({"count": 0, "sha256": "a" * 64}, "is impossible"),
        ({"count": 4, "sha256": GENESIS}, "is impossible"),
        ({"count": 4}, "is not {count, sha256}"),
        ({"count": 4, "sha256": "a" * 64, "path": "/etc"}, "is not {count, sha256}"),
        ("4:" + "a" * 64, "is not {count, sha256}"),
    ],
)
def test_the_server_refuses_a_reply_whose_head_is_malformed(tmp_path: Path, head: object, words: str) -> None:
    good = encode(EvaluateReply(0, 3, {"test_acc": 1.0}, 0.1))
    bad = ({**good[0], HEAD_FIELD: head}, {})
    pool = _Replies({0: bad, 1: ({**good[0], "client": 1, HEAD_FIELD: {"count": 2, "sha256": "b" * 64}}, {})})
    pool.anchors = Anchors(tmp_path / ANCHORS_FILE, RUN)
    replies = pool.exchange({0: EvaluateTask(RUN, 1, 0, [], None), 1: EvaluateTask(RUN, 1, 1, [], None)})
    assert isinstance(replies[0], Failure)
    assert replies[0].reason.startswith("its reply cannot be read (FederationError: its outbound_head")
    assert words in replies[0].reason
    assert isinstance(replies[1], EvaluateReply)
    kept = json.loads((tmp_path / ANCHORS_FILE).read_text())["hospitals"]
    assert list(kept) == ["1"]  # the malformed head is not kept
    assert kept["1"]["count"] == 2
    assert check_message(describe("from_hospital", bad), []) != []
    assert check_message(describe("from_hospital", pool.replies[1]), []) == []
    with pytest.raises(FederationError, match="outbound_head"):
        parse_head(head)


def test_a_reply_without_a_head_changes_no_anchor(tmp_path: Path) -> None:
    """A failure the transport made up (the hospital never answered) carries no head: the anchor stays."""
    anchors = Anchors(tmp_path / ANCHORS_FILE, RUN)
    stamped = encode(EvaluateReply(0, 3, {"test_acc": 1.0}, 0.1))
    stamped = ({**stamped[0], HEAD_FIELD: Head(2, "c" * 64).as_header()}, {})
    anchors.record(0, stamped)
    anchors.record(0, encode(Failure(0, "no answer", silent=True)))
    kept = json.loads((tmp_path / ANCHORS_FILE).read_text())
    assert kept["hospitals"]["0"]["count"] == 2
    assert kept["hospitals"]["0"]["reply_sha256"] == envelope_digest(stamped)
    # a resumed run keeps the anchors of its own run id, and starts afresh for another
    assert Anchors(tmp_path / ANCHORS_FILE, RUN).hospitals["0"]["replies"] == 1
    assert Anchors(tmp_path / ANCHORS_FILE, "another-run").hospitals == {}


def test_a_run_keeps_every_hospitals_head_and_each_log_holds_it(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The round loop keeps ``anchors.json`` (and, with ``run.audit``, every reply's head in ``messages.jsonl``);
    each hospital's log holds its anchor."""
    run = tmp_path / "run"
    train(load_config(None, [*TINY_SETTINGS, "run.rounds=1", "run.audit=true"], data=dataset), run, progress=False)
    anchors = json.loads((run / ANCHORS_FILE).read_text())
    assert anchors["run"] == run.name
    assert sorted(anchors["hospitals"]) == ["0", "1", "2"]
    lines = [json.loads(line) for line in (run / AUDIT_FILE).read_text().splitlines()]
    received = [line for line in lines if line["direction"] == "from_hospital"]
    for c in (0, 1, 2):
        state = run / "hospitals" / f"client_{c:02d}"
        records = read_outbound(state / OUTBOUND_FILE).records
        entry = anchors["hospitals"][str(c)]
        assert entry["count"] == len(records) - 1
        assert entry["replies"] == len(records)
        heads = [line["header"][HEAD_FIELD] for line in received if line["client"] == c]
        assert heads == [{"count": n, "sha256": r["prev"]} for n, r in enumerate(records)]
        assert [line["sha256"] for line in received if line["client"] == c] == [r["sha256"] for r in records]
        code, output = _audit(
            monkeypatch, capsys, "--state", str(state), "--anchor", str(run / ANCHORS_FILE), "--hospital", str(c)
        )
        assert code == 0, output
        assert INTACT in output
        assert f"the anchor of run {run.name}, hospital {c} (" in output


# -- issue 48, part 2: an anchor that only moves forward, and a count the audit compares ----------------------------


def test_a_reply_whose_head_is_behind_the_anchor_is_refused_naming_the_hospital(
    dataset: Path, played: Path, tmp_path: Path
) -> None:
    root = tmp_path / "copy"
    shutil.copytree(played, root)
    log = root / "state_0" / OUTBOUND_FILE
    log.write_text(_lines(log)[0] + "\n")  # cut back to its first line: the hospital goes on from there
    anchors_path = root / "server" / ANCHORS_FILE
    before = json.loads(anchors_path.read_text())["hospitals"]
    pool = InProcessPool([Site(dataset, c, root / f"state_{c}", per_run=True, policy=HospitalPolicy()) for c in (0, 1)])
    pool.anchors = Anchors(anchors_path, RUN)
    keys = honest_keys(config_of(dataset))
    replies = pool.exchange({c: EvaluateTask(RUN, 1, c, keys, None) for c in (0, 1)})
    refused = replies[0]
    assert isinstance(refused, Failure)
    assert refused.client == 0
    assert refused.reason.startswith(
        "hospital 0's outbound log went back: this reply says it held 1 line(s) before its own, but its "
        f"evaluate_reply received {before['0']['received']} was recorded as line 5 ({anchors_path}): its "
        "outbound.jsonl was cut back, replaced or emptied; the reply is refused and its anchor kept"
    )
    assert isinstance(replies[1], EvaluateReply)  # the honest hospital goes on
    after = json.loads(anchors_path.read_text())["hospitals"]
    assert after["0"] == before["0"]  # before: overwritten with the lower head, so audit said intact
    assert (after["1"]["count"], after["1"]["replies"]) == (5, 6)


def test_audit_compares_the_anchors_reply_count_with_the_log(
    dataset: Path,
    played: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The anchor an earlier server kept after the log was cut back and went on: its head is the log's, but it counts
    6 replies received where the log holds 2."""
    state, _ = _copy(played, tmp_path)
    log = state / OUTBOUND_FILE
    log.write_text(_lines(log)[0] + "\n")
    pool = InProcessPool([Site(dataset, 0, state, per_run=True, policy=HospitalPolicy())])  # no anchors kept
    keys = honest_keys(config_of(dataset))
    assert isinstance(pool.exchange({0: EvaluateTask(RUN, 1, 0, keys, None)})[0], EvaluateReply)
    first, second = _lines(log)
    record = json.loads(second)
    entry = {
        "count": 1,
        "sha256": hashlib.sha256(first.encode()).hexdigest(),
        "reply_sha256": record["sha256"],
        "record_sha256": content_digest(record),
        "kind": "evaluate_reply",
        "received": "2026-11-28T00:00:00+00:00",
        "replies": 6,
    }
    anchors = tmp_path / ANCHORS_FILE
    anchors.write_text(json.dumps({"format": 1, "run": RUN, "hospitals": {"0": entry}}))
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors))
    assert code == 1, output
    assert f"anchor: the anchor of run {RUN}, hospital 0 ({anchors})" in output  # its only hospital, named
    assert _anchor_problems(output) == [
        f"{log}: the log holds 2 replies of run {RUN}, but the anchor of run {RUN}, hospital 0 ({anchors}) counts 6 "
        "received: records were removed (the log was cut back and went on)"
    ]
    entry["replies"] = 2  # the same log with an honest count is intact
    anchors.write_text(json.dumps({"format": 1, "run": RUN, "hospitals": {"0": entry}}))
    code, output = _audit(monkeypatch, capsys, "--state", str(state), "--anchor", str(anchors))
    assert code == 0, output
    assert INTACT in output


def test_a_resume_whose_hospital_log_was_cut_back_stops_naming_the_hospital(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "R"
    settings = [arg for setting in (*TINY_SETTINGS, "run.rounds=1") for arg in ("--set", setting)]
    assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run), "-q", *settings) == 0
    anchor = json.loads((run / ANCHORS_FILE).read_text())["hospitals"]["0"]
    log = run / "hospitals" / "client_00" / OUTBOUND_FILE
    log.write_text(_lines(log)[0] + "\n")  # cut back to its first line
    capsys.readouterr()
    code = run_cli(monkeypatch, "train", "--resume", str(run), "-q", "--set", "run.rounds=2")
    err = capsys.readouterr().err
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert errors[0].startswith(
        "error: hospital 0: hospital 0's outbound log went back: this reply says it held 1 line(s) before its own, "
        "but its evaluate_reply received "
    )
    assert f"was recorded as line 3 ({run / ANCHORS_FILE}): its outbound.jsonl was cut back" in errors[0]
    # hospital 0's anchor kept (before: overwritten with the lower head); the others' moved on with their hellos
    assert json.loads((run / ANCHORS_FILE).read_text())["hospitals"]["0"] == anchor
