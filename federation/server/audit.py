"""The server's records of what crossed between it and each hospital: the boundary log and the anchors.

docs/design.md, "Trust model": only shared tensors, example counts and scalar metrics leave a hospital.
With ``run.audit = true`` every envelope a pool carries (``federation.engine.pools``, Flower's included) is
described in ``<run>/messages.jsonl``: direction, kind, client, the sha256 of the envelope, the header's scalar
fields (a reply's ``outbound_head`` included) and, for each tensor, its name, shape, dtype and whether all its
values are finite; never the values themselves. A hospital's data officer can read it to see exactly what left
the site; ``check_message`` is the rule the tests apply to it.

Whatever ``run.audit`` says, the server keeps ``<run>/anchors.json`` (``Anchors``): for each hospital, the head of
its outbound log that its latest reply carried (``federation.wire.chain.HEAD_FIELD``, checked by
``parse_head`` before the reply is read) and the digests of that reply. ``load_anchor`` reads one hospital's
entry for ``gastric-fl federation audit --anchor``, which then shows whether the hospital's log still holds it
(a log cut short, emptied, re-chained or edited at its end does not). The file::

    {"format": 1, "run": RUN_ID, "hospitals": {"0": {"count": 5, "sha256": HEX, "reply_sha256": HEX,
      "record_sha256": HEX, "kind": "train_reply", "received": ISO_TIME, "replies": 3}, ...}}

``count`` / ``sha256``: the log's head before the reply's own line; ``reply_sha256``: the reply's
``envelope_digest``; ``record_sha256``: ``content_digest`` of its record (``reply_content``); ``replies``: how many
replies of that hospital carried a head in this run.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from federation.errors import FederationError
from federation.runfiles import ANCHORS_FILE as ANCHORS_FILE  # named with the run's other files
from federation.runfiles import AUDIT_FILE as AUDIT_FILE
from federation.runs import now_iso
from federation.wire.chain import HEAD_FIELD, Anchor, content_digest, parse_head, reply_content
from federation.wire.codec import Envelope, envelope_digest
from federation.wire.contract import CLASS_NAME
from infra.outputs import write_atomic

ANCHORS_FORMAT = 1

# Header fields a hospital may send: identity, counts, scalar metrics, timing, a failure's one-line reason, and
# its dataset's class names (``HelloReply.classes``: plain names only, `CLASS_NAME`).
REPLY_FIELDS = frozenset(
    {
        "kind",
        "client",
        "num_train",
        "num_test",
        "num_examples",
        "metrics",
        "seconds",
        "reason",
        "silent",
        "diverged",
        "evaluation",
        "previous",
        "classes",
        HEAD_FIELD,  # the hospital's outbound-log head before this reply's line (federation.hospital.outbound)
    }
)


def describe(direction: str, envelope: Envelope) -> dict[str, Any]:
    """One line of the boundary log for ``envelope`` (no tensor values)."""
    header, tensors = envelope
    return {
        "direction": direction,
        "kind": header.get("kind"),
        "client": header.get("client"),
        "sha256": envelope_digest(envelope),
        "header": {k: v for k, v in header.items() if k != "config_toml"},
        "tensors": {
            name: {
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "finite": bool(torch.isfinite(t).all()) if t.is_floating_point() else True,
            }
            for name, t in tensors.items()
        },
    }


class AuditLog:
    """An observer (``Pool.observers``) appending ``describe`` lines to ``path``; safe from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, direction: str, envelope: Envelope) -> None:
        line = json.dumps(describe(direction, envelope), allow_nan=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)


def _scalars(value: Any) -> Iterable[Any]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _scalars(v)
    elif isinstance(value, list):
        for v in value:
            yield from _scalars(v)
    else:
        yield value


def check_message(line: Mapping[str, Any], shared_keys: Sequence[str]) -> list[str]:
    """What in a ``from_hospital`` log line breaks the boundary rule (empty when nothing does).

    Tensors: only ``shared/<key>`` (and ``second_moment/<key>``, paper 004) for a shared key, all finite.
    Header: only ``REPLY_FIELDS``, whose values are integers, finite floats, ``null`` (an undefined metric) or,
    for ``kind`` and a failure's ``reason``, text (``silent``: a boolean); ``classes`` only in a hello reply, as
    a list of plain class names (``CLASS_NAME``: letters, digits, ``.``, ``_``, ``-``; at most 64 characters);
    ``outbound_head`` a count >= 0 and 64 hex digits (``parse_head``).
    """
    problems: list[str] = []
    shared = set(shared_keys)
    for name, info in line["tensors"].items():
        kind, _, key = name.partition("/")
        if kind not in ("shared", "second_moment") or key not in shared:
            problems.append(f"tensor {name} is not a shared key")
        if not info["finite"]:
            problems.append(f"tensor {name} is not finite")
    header = line["header"]
    for key, value in header.items():
        if key not in REPLY_FIELDS:
            problems.append(f"header field {key} may not leave a hospital")
            continue
        if key in ("silent", "diverged"):
            if not isinstance(value, bool):
                problems.append(f"{key} is not true or false")
            continue
        if key == "classes":
            if (
                header.get("kind") != "hello_reply"
                or not isinstance(value, list)
                or not all(isinstance(c, str) and CLASS_NAME.match(c) for c in value)
            ):
                problems.append("classes is not a hello reply's list of plain class names")
            continue
        if key == HEAD_FIELD:
            try:
                parse_head(value)
            except FederationError as exc:
                problems.append(str(exc))
            continue
        if key in ("kind", "reason"):
            if not isinstance(value, str) or (key == "reason" and ("\n" in value or len(value) > 500)):
                problems.append(f"{key} is not one line of text")
            continue
        for v in _scalars(value):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                problems.append(f"header field {key} holds {v!r}, not a finite number")
    return problems


class Anchors:
    """The server's copy of each hospital's outbound-log head (``<run>/anchors.json``, module docstring), updated
    with every reply that carries one and rewritten atomically (``infra.outputs.write_atomic``) each time. A resumed
    run keeps the entries of its own run id; a file that is unreadable or of another run is replaced."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.run_id = run_id
        self.hospitals: dict[str, dict[str, Any]] = {}
        try:
            previous = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(previous, dict) and previous.get("run") == run_id and isinstance(previous.get("hospitals"), dict):
            self.hospitals = {str(k): v for k, v in previous["hospitals"].items() if isinstance(v, dict)}

    def record(self, hospital: int, envelope: Envelope) -> str | None:
        """Keep the head ``envelope`` (a reply of hospital ``hospital``) carries, with its digests; a reply without
        one (a failure the transport made up: the hospital never answered) changes nothing. An anchor only moves
        forward: a head behind the one kept (fewer lines than the kept head plus the kept reply's own line: the
        hospital's ``outbound.jsonl`` was cut back, replaced or emptied) is not kept, and the reason to refuse the
        reply is returned (one line naming the hospital); otherwise ``None``."""
        value = envelope[0].get(HEAD_FIELD)
        if value is None or hospital < 0:
            return None
        head = parse_head(value)
        entry = self.hospitals.get(str(hospital), {})
        kept = entry.get("count")
        if isinstance(kept, int) and not isinstance(kept, bool) and head.count <= kept:
            return (
                f"hospital {hospital}'s outbound log went back: this reply says it held {head.count} line(s) before "
                f"its own, but its {entry.get('kind')} received {entry.get('received')} was recorded as line "
                f"{kept + 1} ({self.path}): its outbound.jsonl was cut back, replaced or emptied; the reply is "
                "refused and its anchor kept (check it with gastric-fl federation audit --anchor)"
            )
        digest = envelope_digest(envelope)
        self.hospitals[str(hospital)] = {
            **head.as_header(),
            "reply_sha256": digest,
            "record_sha256": content_digest(reply_content(envelope, digest)),
            "kind": envelope[0].get("kind"),
            "received": now_iso(),
            "replies": int(entry.get("replies", 0)) + 1,
        }
        data = {"format": ANCHORS_FORMAT, "run": self.run_id, "hospitals": dict(sorted(self.hospitals.items()))}
        write_atomic(self.path, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode("utf-8"))
        return None


def load_anchor(path: Path, hospital: int | None = None) -> Anchor:
    """Hospital ``hospital``'s entry of the anchors file ``path`` (``Anchors``) as an ``Anchor``. Without ``hospital``:
    the file's only hospital; a file of several needs it named (never taken from the log under audit, whose
    records the hospital's side can edit). Anything unreadable or missing is a ``FederationError`` naming the file
    and what to give instead."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FederationError(
            f"--anchor {path} cannot be read ({exc.strerror or exc}): give the run's {ANCHORS_FILE}"
        ) from exc
    except ValueError as exc:
        raise FederationError(f"--anchor {path} is not JSON ({exc}): give the run's {ANCHORS_FILE}") from exc
    hospitals = data.get("hospitals") if isinstance(data, dict) else None
    run = data.get("run") if isinstance(data, dict) else None
    if not isinstance(hospitals, dict) or not isinstance(run, str) or data.get("format") != ANCHORS_FORMAT:
        raise FederationError(
            f"--anchor {path} is not a server's {ANCHORS_FILE} (format {ANCHORS_FORMAT}, a run and its hospitals)"
        )
    held = sorted(int(k) for k in hospitals if str(k).isdigit())
    if hospital is None:
        if len(held) != 1:
            raise FederationError(
                f"--anchor {path} holds hospitals {held or 'none'} of run {run}: name the hospital this log is with "
                "--hospital N (audit does not take it from the log, whose records can be edited)"
            )
        hospital = held[0]
    entry = hospitals.get(str(hospital))
    if not isinstance(entry, dict):
        raise FederationError(
            f"--anchor {path} holds no head of hospital {hospital} in run {run} (it holds {held or 'none'}): "
            "the hospital never answered in that run, or give its --hospital N"
        )
    try:
        head = parse_head({"count": entry.get("count"), "sha256": entry.get("sha256")})
        reply, record = entry["reply_sha256"], entry["record_sha256"]
        if not isinstance(reply, str) or not isinstance(record, str):
            raise TypeError("reply_sha256 and record_sha256 must be text")
    except (FederationError, KeyError, TypeError) as exc:
        raise FederationError(f"--anchor {path}: hospital {hospital}'s entry is damaged ({exc})") from exc
    replies = entry.get("replies")
    return Anchor(
        head,
        str(path),
        run=run,
        hospital=hospital,
        reply_sha256=reply,
        record_sha256=record,
        kind=str(entry.get("kind")),
        replies=replies if isinstance(replies, int) and not isinstance(replies, bool) and replies >= 0 else None,
    )
