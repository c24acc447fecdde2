"""The hospital's own record of what left it: an append-only, hash-chained log (DESIGN.md, "Trust model").

Every reply a hospital sends is described in ``outbound.jsonl`` in the hospital's state folder *before* it
leaves (``Hospital.answer``): the time, the run, the round, what was asked and what was answered, every tensor's
name, shape and dtype, how many values left, the scalars (example counts, metrics, a refusal's reason) and the
sha256 of the reply in a canonical form (``federation.engine.codec.envelope_digest``, the same whatever the
transport: the server's ``messages.jsonl`` (``run.audit``) records the same digest of each reply it received, so
the two records can be matched). A reply whose record cannot be written does not leave: the hospital answers with
a data-free ``Failure`` instead.

Each line carries ``prev``, the sha256 of the line before it (the first line: 64 zeros), so that a line edited,
removed or inserted later breaks the chain at a named line; ``read_outbound`` finds it and
``gastric-fl federation audit --state DIR`` (``audit_report``) says so first. The tensor values themselves are
never written here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.engine.codec import Envelope, envelope_digest
from federation.errors import FederationError
from federation.runfiles import OUTBOUND_FILE as OUTBOUND_FILE  # named with the run's other files

GENESIS = "0" * 64
REFUSED_PREFIX = "refused by "  # how a policy refusal's reason starts (federation.engine.policy)


def _line_hash(line: bytes) -> str:
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def _finite(value: Any) -> Any:
    """JSON-safe scalars: non-finite floats become their text ("nan", "inf") so that nothing is lost."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def describe_reply(request: Mapping[str, Any], reply: Envelope) -> dict[str, Any]:
    """The log record of ``reply`` (an encoded message) sent in answer to a message with header ``request``."""
    header, tensors = reply
    reason = header.get("reason")
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run": request.get("run_id"),
        "round": request.get("round"),
        "asked": request.get("kind"),
        "kind": header.get("kind"),
        "client": header.get("client"),
        "tensors": {
            name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for name, t in tensors.items()
        },
        "values": sum(int(t.numel()) for t in tensors.values()),
        "scalars": _finite({k: v for k, v in header.items() if k not in ("kind", "client", "reason")}),
        **({"reason": reason} if reason is not None else {}),
        "refused": isinstance(reason, str) and reason.startswith(REFUSED_PREFIX),
        "sha256": envelope_digest(reply),
    }


def append_outbound(path: Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` to the log at ``path`` with ``prev`` chained to the last line; flushed to disk before it
    returns (the reply leaves only after). Locked, so two processes of one hospital never interleave lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "r+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        prev = GENESIS
        if size:
            handle.seek(max(0, size - (1 << 16)))
            tail = handle.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
            prev = _line_hash(tail)
        line = json.dumps({**record, "prev": prev}, allow_nan=False).encode("utf-8") + b"\n"
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


@dataclass
class OutboundLog:
    """What ``read_outbound`` found: the records, and where the chain or a line is broken (one line each)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_outbound(path: Path) -> OutboundLog:
    """Read and verify the log at ``path``: every line JSON, every ``prev`` the hash of the line before."""
    out = OutboundLog()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FederationError(f"{path} cannot be read ({exc.strerror or exc}): is it a hospital's state?") from exc
    prev = GENESIS
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            out.problems.append(f"{path}:{number}: not a JSON line (damaged or edited)")
            prev = _line_hash(line)
            continue
        if not isinstance(record, dict) or record.get("prev") != prev:
            out.problems.append(f"{path}:{number}: the chain is broken (a line before it was edited or removed)")
        if isinstance(record, dict):
            out.records.append(record)
        prev = _line_hash(line)
    return out


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


def audit_report(path: Path) -> tuple[str, bool]:
    """What a privacy officer reads: the log's integrity, the runs, what left per run (messages, tensors, values),
    and every refusal. Returns the text and whether the log is intact."""
    log = read_outbound(path)
    lines = [f"outbound log: {path} ({len(log.records)} replies)"]
    if log.problems:
        lines.append(f"INTEGRITY: {len(log.problems)} problem(s); the log cannot be trusted past the first:")
        lines += [f"  {p}" for p in log.problems[:10]]
    else:
        lines.append("integrity: intact (every line chained to the one before)")
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
    return "\n".join(lines), not log.problems
