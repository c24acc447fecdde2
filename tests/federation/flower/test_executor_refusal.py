"""A deployed hospital's refusal of a foreign app is in its outbound log before it leaves (issue 34, item 6).

The operator submits another app to the SuperNode; the hospital's executor (``federation.flower.executor``) never
installs it and answers with an error. Played at ``HospitalExecutor.reply`` with a message and context as the
SuperNode's runtime hands them over: every refusal is a line of the hospital's ``outbound.jsonl`` (in its
``hospital-dir``, even where the node names no dataset), and ``gastric-fl federation audit`` counts them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from support.cli import run_cli

from federation.flower.executor import APP_ID, HospitalExecutor
from federation.hospital.outbound import OUTBOUND_FILE, read_outbound

FOREIGN = "someone/else"


@pytest.fixture
def incoming(monkeypatch: pytest.MonkeyPatch) -> Message:
    """A train message as the SuperNode's runtime delivers it to the executor (task 3 of Flower run 41)."""
    for name, value in (("_run_id", 41), ("_node_id", 5), ("_task_id", 3)):
        monkeypatch.setattr(TaskIdentity, name, value)
    message = Message(RecordDict(), dst_node_id=5, message_type="train")
    message.metadata.__dict__["_message_id"] = "m1"
    return message


def _context(node_config: dict[str, bool | float | int | str]) -> Context:
    return Context(run_id=41, node_id=5, node_config=node_config, state=RecordDict(), run_config={})


def test_nine_refusals_of_a_foreign_app_are_nine_lines_of_the_outbound_log(
    incoming: Message, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    executor = HospitalExecutor.__new__(HospitalExecutor)  # no SuperNode to talk to: reply() is all it does here
    context = _context({"partition-id": 1, "hospital-dir": str(tmp_path / "h 1")})  # as the deployment tests start it
    for _ in range(9):
        reply = executor.reply(incoming, context, FOREIGN)
        assert reply.has_error()
        assert reply.error.reason.startswith(f"refused by the hospital: the run carries the app {FOREIGN!r}")
    log = read_outbound(tmp_path / "h 1" / OUTBOUND_FILE)
    assert log.problems == []
    assert len(log.records) == 9
    first = log.records[0]
    assert first["run"] == f"flower run 41 ({FOREIGN})"
    assert first["asked"] == "train"
    assert first["kind"] == "failure"
    assert first["client"] == 1
    assert first["refused"] is True
    assert first["values"] == 0
    assert first["reason"] == reply.error.reason
    assert [r["scalars"]["outbound_head"]["count"] for r in log.records] == list(range(9))
    capsys.readouterr()
    assert run_cli(monkeypatch, "federation", "audit", "--state", str(tmp_path / "h 1")) == 0
    output = capsys.readouterr().out
    assert "refused requests: 9" in output
    assert f"run flower run 41 ({FOREIGN}): 9 replies (9 failure)" in output


def test_a_refusal_without_a_hospital_dir_still_leaves_and_says_it_is_not_recorded(
    incoming: Message, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    executor = HospitalExecutor.__new__(HospitalExecutor)
    reply = executor.reply(incoming, _context({"partition-id": 7}), FOREIGN)
    assert reply.has_error()
    assert "refused by the hospital" in reply.error.reason
    assert "this refusal is not in the outbound log: FederationError: the SuperNode's --node-config lacks" in (
        capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []


def test_our_own_app_is_not_refused(incoming: Message, tmp_path: Path) -> None:
    """The check itself can fail the other way: our app id reaches the hospital (here it cannot read the empty
    message, and says so in a reply of its own, recorded as every reply is)."""
    executor = HospitalExecutor.__new__(HospitalExecutor)
    executor.hospitals = {}
    config = {"hospital-dir": str(tmp_path / "h"), "data-path": str(tmp_path / "none"), "client": 0}
    reply = executor.reply(incoming, _context(config), APP_ID)
    assert not reply.has_error()
    records = [json.loads(line) for line in (tmp_path / "h" / OUTBOUND_FILE).read_text().splitlines()]
    assert len(records) == 1
    assert records[0]["refused"] is False
    assert "cannot read the message" in records[0]["reason"]
