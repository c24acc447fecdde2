"""The hospital's own record of what left it: an append-only, hash-chained log (docs/design.md, "Trust model").

Every reply a hospital sends is described in ``outbound.jsonl`` in the hospital's state folder *before* it
leaves (``Hospital.answer``, through ``record_reply``): the time, the run, the round, what was asked and what was
answered, every tensor's name, shape and dtype, how many values left, the scalars (example counts, metrics, a
refusal's reason) and the sha256 of the reply in a canonical form (``federation.wire.codec.envelope_digest``,
the same whatever the transport: the server's ``messages.jsonl`` (``run.audit``) records the same digest of each
reply it received, so the two records can be matched). A reply whose record cannot be written does not leave: the
hospital answers with a data-free ``Failure`` instead. A refusal of a foreign app by a deployed hospital's
executor (``federation.flower.executor``) is recorded the same way before it leaves.

Each line carries ``prev``, the sha256 of the line before it (the first line: 64 zeros), so that a line edited,
removed or inserted later breaks the chain at a named line; ``read_outbound`` finds it and
``gastric-fl federation audit --state DIR`` (``audit_report``) says so first. The tensor values themselves are
never written here.

A chain alone cannot show that its *end* is still there: a log cut short, emptied or re-chained (every ``prev``
recomputed) reads as intact. So every reply carries the log's head as it was before the reply's own line was
added (``HEAD_FIELD``: ``{"count": lines, "sha256": hash of the last line}``; a reply cannot carry the hash of
its own line), and the server keeps the latest head of each hospital with the digests of the reply that carried
it (``federation.server.audit.Anchors``: ``<run>/anchors.json``). ``audit_report`` with such an ``Anchor`` (or a
head a hospital noted) checks that line ``count`` still hashes to the head and that line ``count + 1`` is the
record of that very reply; without one it says that the end cannot be checked.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from federation.errors import FederationError
from federation.runfiles import OUTBOUND_FILE as OUTBOUND_FILE  # named with the run's other files
from federation.wire.chain import (
    GENESIS,
    HEAD_FIELD,
    Anchor,
    Head,
    content_digest,
    line_hash,
    reply_content,
)
from federation.wire.codec import Envelope


def describe_reply(request: Mapping[str, Any], reply: Envelope) -> dict[str, Any]:
    """The log record of ``reply`` (an encoded message) sent in answer to a message with header ``request``."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run": request.get("run_id"),
        "round": request.get("round"),
        "asked": request.get("kind"),
        **reply_content(reply),
    }


def _lines(data: bytes) -> list[tuple[int, bytes]]:
    """The log's non-blank lines with their line numbers in the file (what the head counts)."""
    return [(number, line) for number, line in enumerate(data.splitlines(), start=1) if line.strip()]


def head_of(data: bytes) -> Head:
    """The head of a log whose bytes are ``data``."""
    lines = _lines(data)
    return Head(len(lines), line_hash(lines[-1][1]) if lines else GENESIS)


@contextmanager
def _locked(path: Path) -> Iterator[IO[bytes]]:
    """The log opened for appending under an exclusive lock, so two processes of one hospital never interleave."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "r+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield handle


def _append(handle: IO[bytes], data: bytes, head: Head, record: Mapping[str, Any]) -> None:
    """Write ``record`` chained to the last line of ``data`` (the log's bytes, whose head is ``head``), flushed to
    disk. A last line cut short by a crash (no newline) is ended first, so that the new line stays a line of its
    own."""
    line = json.dumps({**record, "prev": head.sha256}, allow_nan=False).encode("utf-8") + b"\n"
    handle.write((b"\n" if data and not data.endswith(b"\n") else b"") + line)
    handle.flush()
    os.fsync(handle.fileno())


def append_outbound(path: Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` to the log at ``path`` with ``prev`` chained to the last line; flushed to disk before it
    returns (the reply leaves only after). Locked, so two processes of one hospital never interleave lines."""
    with _locked(path) as handle:
        data = handle.read()
        _append(handle, data, head_of(data), record)


def record_reply(path: Path, request: Mapping[str, Any], reply: Envelope) -> Envelope:
    """Record ``reply`` (sent in answer to a message with header ``request``) in the log at ``path`` and return
    what leaves: ``reply`` with the log's head before its own line in ``HEAD_FIELD``. The head is read and the line
    appended under one lock, so line ``count + 1`` is this reply's record. Raises ``OSError`` when the record
    cannot be written: then nothing of ``reply`` may leave."""
    with _locked(path) as handle:
        data = handle.read()
        head = head_of(data)  # read once: it stamps the reply and chains its line
        header, tensors = reply
        stamped: Envelope = ({**header, HEAD_FIELD: head.as_header()}, tensors)
        _append(handle, data, head, describe_reply(request, stamped))
    return stamped


@dataclass
class OutboundLog:
    """What ``read_outbound`` found: the records, and where the chain or a line is broken (one line each)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise FederationError(f"{path} cannot be read ({exc.strerror or exc}): is it a hospital's state?") from exc


def _verify(path: Path, data: bytes) -> OutboundLog:
    out = OutboundLog()
    prev = GENESIS
    for number, line in _lines(data):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            out.problems.append(f"{path}:{number}: not a JSON line (damaged or edited)")
            prev = line_hash(line)
            continue
        if not isinstance(record, dict) or record.get("prev") != prev:
            out.problems.append(f"{path}:{number}: the chain is broken (a line before it was edited or removed)")
        if isinstance(record, dict):
            out.records.append(record)
        prev = line_hash(line)
    return out


def read_outbound(path: Path) -> OutboundLog:
    """Read and verify the log at ``path``: every line JSON, every ``prev`` the hash of the line before."""
    return _verify(path, _read_bytes(path))


def find_outbound(state: Path) -> Path:
    """The outbound log of a hospital state folder: ``DIR/outbound.jsonl`` (a run's ``hospitals/client_XX``),
    or ``DIR/runs/outbound.jsonl`` (``gastric-fl federation hospital --state DIR``)."""
    for candidate in (state / OUTBOUND_FILE, state / "runs" / OUTBOUND_FILE, state):
        if candidate.is_file():
            return candidate
    raise FederationError(
        f"no {OUTBOUND_FILE} in {state} or {state / 'runs'}: give --state the folder a hospital was started with "
        "(gastric-fl federation hospital --state DIR) or a run's hospitals/client_XX folder"
    )


def check_anchor(path: Path, data: bytes, anchor: Anchor) -> list[str]:
    """Where the log with bytes ``data`` at ``path`` has lost what ``anchor`` says it held (one line each; empty
    when it holds it): fewer lines than the anchor counts (cut short, emptied), a line ``count`` that does not hash
    to the anchor's head (edited, re-chained, another hospital's log), a line ``count + 1`` that is not the record
    of the anchored reply (edited: a reply made to read as a refusal), and, when nothing else is wrong, fewer records
    of the anchor's run than the server received replies (``replies``: a log cut back and gone on, whose anchor an
    earlier server overwrote with the lower head)."""
    lines = _lines(data)
    count, whose = anchor.head.count, anchor.whose()
    need = count + (1 if anchor.reply_sha256 is not None else 0)
    problems: list[str] = []
    if len(lines) < need:
        what = (
            f"the {anchor.kind} recorded as line {count + 1}" if anchor.reply_sha256 is not None else f"{count} line(s)"
        )
        problems.append(
            f"{path}:{len(lines) + 1}: the log ends after {len(lines)} line(s), but {whose} holds {what}: "
            f"{'it was emptied' if not lines else 'lines were removed from its end'}"
        )
    if 0 < count <= len(lines):
        number, line = lines[count - 1]
        if line_hash(line) != anchor.head.sha256:
            problems.append(
                f"{path}:{number}: does not hash to {whose} (sha256 {anchor.head.sha256[:12]}...): a line up to it "
                "was edited or removed and the chain recomputed, or this is another hospital's log"
            )
    if anchor.reply_sha256 is not None and len(lines) > count:
        number, line = lines[count]
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if (
            not isinstance(record, dict)
            or record.get("sha256") != anchor.reply_sha256
            or content_digest(record) != anchor.record_sha256
            or record.get("run") != anchor.run
        ):
            seen = (
                f"it records kind {record.get('kind')}{', refused' if record.get('refused') else ''}, run "
                f"{record.get('run')}, hospital {record.get('client')}, sha256 {str(record.get('sha256'))[:12]}..."
                if isinstance(record, dict)
                else "it is not JSON"
            )
            problems.append(
                f"{path}:{number}: should record the {anchor.kind} (sha256 {anchor.reply_sha256[:12]}...) that "
                f"{whose} received, but {seen}: the line was edited, or this is another hospital's log"
            )
    if anchor.replies is not None and anchor.run is not None and not problems:
        held = 0
        for _, line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            held += isinstance(record, dict) and record.get("run") == anchor.run
        if held < anchor.replies:
            problems.append(
                f"{path}: the log holds {held} repl{'y' if held == 1 else 'ies'} of run {anchor.run}, but {whose} "
                f"counts {anchor.replies} received: records were removed (the log was cut back and went on)"
            )
    return problems


def audit_report(path: Path, anchors: tuple[Anchor, ...] = ()) -> tuple[str, bool]:
    """What a privacy officer reads: the log's integrity, the runs, what left per run (messages, tensors, values),
    and every refusal. Returns the text and whether the log is intact: every line chained to the one before and,
    for each of ``anchors``, holding what it anchors (``check_anchor``). Without an anchor the end of the log
    cannot be checked, and the text says so."""
    data = _read_bytes(path)
    log = _verify(path, data)
    head = head_of(data)
    anchored = [p for anchor in anchors for p in check_anchor(path, data, anchor)]
    lines = [f"outbound log: {path} ({len(log.records)} replies)"]
    lines += [f"anchor: {anchor.whose()}" for anchor in anchors]
    if log.problems:
        lines.append(f"INTEGRITY: {len(log.problems)} problem(s); the log cannot be trusted past the first:")
        lines += [f"  {p}" for p in log.problems[:10]]
    if anchored:
        lines.append(f"INTEGRITY: the log does not hold its anchor ({len(anchored)} problem(s)):")
        lines += [f"  {p}" for p in anchored]
    if not log.problems and not anchored:
        if anchors:
            lines.append("integrity: intact (every line chained to the one before; the log holds its anchor)")
        else:
            lines.append(
                "integrity: every line is chained to the one before, but the end of the log cannot be checked "
                "without an anchor (a log cut short, emptied or re-chained reads the same): give --anchor "
                "RUN/anchors.json (the server's record) or --count N --sha256 H (a head noted earlier)"
            )
    lines.append(
        f"head: {head.count} lines, sha256 {head.sha256} (note it: --count {head.count} --sha256 {head.sha256} "
        "checks later that this log kept its end)"
    )
    runs: dict[str, list[dict[str, Any]]] = {}
    for record in log.records:
        runs.setdefault(str(record.get("run")), []).append(record)
    for run, records in runs.items():
        kinds = Counter(str(r.get("kind")) for r in records)
        keys = sorted({k for r in records for k in r.get("tensors", {})})
        rounds = [r["round"] for r in records if isinstance(r.get("round"), int)]
        span = f"rounds {min(rounds)}-{max(rounds)}" if rounds else "no round"
        lines.append(
            f"run {run}: {len(records)} replies ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), {span}, "
            f"{records[0].get('time')} to {records[-1].get('time')}; "
            f"{sum(int(r.get('values', 0)) for r in records):,} values left in {len(keys)} distinct tensors"
        )
    refusals = [r for r in log.records if r.get("refused")]
    lines.append(f"refused requests: {len(refusals)}")
    lines += [
        f"  {r.get('time')} run {r.get('run')} round {r.get('round')} ({r.get('asked')}): {r.get('reason')}"
        for r in refusals
    ]
    failures = [r for r in log.records if r.get("kind") == "failure" and not r.get("refused")]
    if failures:
        lines.append(f"other failures: {len(failures)}")
        lines += [f"  {r.get('time')} run {r.get('run')} round {r.get('round')}: {r.get('reason')}" for r in failures]
    return "\n".join(lines), not log.problems and not anchored
