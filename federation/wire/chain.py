"""The head of a hospital's outbound log, as each reply carries it and the server anchors it (docs/design.md,
"Trust model"; the log itself is ``federation.hospital.outbound``).

A hospital's ``outbound.jsonl`` is hash-chained: each line carries ``prev``, the sha256 of the line before it. A
reply carries the log's head before the reply's own line (``HEAD_FIELD``: ``{"count": lines, "sha256": hash of
the last line}``), and the server keeps the latest head of each hospital with the digests of the reply that
carried it (``federation.server.audit.Anchors``). Both sides compute the part of a record that the reply alone
determines (``reply_content``, ``content_digest``) the same way, from this module.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from federation.errors import FederationError
from federation.wire.codec import Envelope, envelope_digest

GENESIS = "0" * 64
REFUSED_PREFIX = "refused by "  # how a policy refusal's reason starts (federation.hospital.policy)
HEAD_FIELD = "outbound_head"  # the reply header field carrying the log's head before the reply's own line
# the fields of a record that the reply alone determines: what the server can check a record against
CONTENT_KEYS = ("kind", "client", "tensors", "values", "scalars", "reason", "refused", "sha256")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def line_hash(line: bytes) -> str:
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


@dataclass(frozen=True)
class Head:
    """Where a log ends: how many lines it holds and the sha256 of its last line (``GENESIS`` when empty)."""

    count: int
    sha256: str

    def as_header(self) -> dict[str, Any]:
        return {"count": self.count, "sha256": self.sha256}


def _shown(value: Any) -> str:
    """A value from the other side as a short repr, for a one-line error."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_head(value: Any) -> Head:
    """A reply's ``HEAD_FIELD`` checked as the server receives it: ``count`` an integer >= 0 and ``sha256`` 64
    lower-case hex digits (``GENESIS`` exactly when ``count`` is 0); anything else is a ``FederationError``."""
    if not isinstance(value, Mapping) or set(value) != {"count", "sha256"}:
        raise FederationError(f"its {HEAD_FIELD} {_shown(value)} is not {{count, sha256}}")
    count, digest = value["count"], value["sha256"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise FederationError(f"its {HEAD_FIELD} count {_shown(count)} is not an integer >= 0")
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise FederationError(f"its {HEAD_FIELD} sha256 {_shown(digest)} is not 64 hex digits")
    if (count == 0) != (digest == GENESIS):
        raise FederationError(f"its {HEAD_FIELD} ({count} lines, sha256 {digest[:12]}...) is impossible")
    return Head(count, digest)


def reply_content(reply: Envelope, digest: str | None = None) -> dict[str, Any]:
    """The part of a reply's record that the reply alone determines (``CONTENT_KEYS``): the server computes it from
    what it received, the hospital wrote it into its log. ``digest``: the reply's ``envelope_digest`` if known."""
    header, tensors = reply
    reason = header.get("reason")
    return {
        "kind": header.get("kind"),
        "client": header.get("client"),
        "tensors": {
            name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for name, t in tensors.items()
        },
        "values": sum(int(t.numel()) for t in tensors.values()),
        "scalars": _finite({k: v for k, v in header.items() if k not in ("kind", "client", "reason")}),
        **({"reason": reason} if reason is not None else {}),
        "refused": isinstance(reason, str) and reason.startswith(REFUSED_PREFIX),
        "sha256": envelope_digest(reply) if digest is None else digest,
    }


def content_digest(record: Mapping[str, Any]) -> str:
    """sha256 of a record's ``CONTENT_KEYS`` in canonical JSON: equal for the hospital's line and the server's copy
    of the same reply, different once any of them is edited."""
    content = {k: record[k] for k in CONTENT_KEYS if k in record}
    return hashlib.sha256(json.dumps(content, sort_keys=True, allow_nan=False).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Anchor:
    """A head the log must still hold, and whose it is. The server's (``federation.server.audit.load_anchor``)
    also names the run, the hospital and the reply that carried the head (its ``envelope_digest``, the
    ``content_digest`` of its record, its kind): the log's line ``count + 1`` must be that reply's record. One a
    hospital noted (``--count N --sha256 H``) is the head alone."""

    head: Head
    source: str  # where it comes from, for the report: a file, or "the head given"
    run: str | None = None
    hospital: int | None = None
    reply_sha256: str | None = None
    record_sha256: str | None = None
    kind: str | None = None
    replies: int | None = None  # how many replies of the run the server received from this hospital with a head

    def whose(self) -> str:
        if self.run is None:
            return f"the head given ({self.head.count} lines, sha256 {self.head.sha256[:12]}...)"
        return f"the anchor of run {self.run}, hospital {self.hospital} ({self.source})"
