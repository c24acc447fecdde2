"""What the round loop sends through: a pool (``Pool``), the transport-independent part of reaching hospitals.

A pool sends ``federation.wire.contract`` messages to hospitals and returns their replies, keyed by client index;
the transports subclass it (``federation.engine.pools``: in this process or in worker processes;
``federation.flower.apps.FlowerPool``: Flower SuperNodes). Every message crosses as a ``federation.wire.codec``
envelope and is shown to the pool's ``observers`` on its way (``"to_hospital"`` / ``"from_hospital"``).
``on_answer``, when set, is called with a client index as soon as that hospital has answered, so the loop can
report progress within a round (``federation.progress``). A reply's head of the hospital's outbound log
(``federation.wire.chain.HEAD_FIELD``) is checked before the reply is read (a malformed one makes the reply a
``Failure``) and, when ``anchors`` is set, kept there (``federation.server.audit.Anchors``: ``<run>/anchors.json``).
A reply the server cannot read comes back as a ``Failure``; the loop decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from federation.errors import FederationError, Interrupted, first_line
from federation.server.audit import REPLY_FIELDS
from federation.wire.chain import HEAD_FIELD, parse_head
from federation.wire.codec import Envelope, Message, decode, encode
from federation.wire.contract import EvaluateTask, Failure, Hello, TrainTask

if TYPE_CHECKING:
    from federation.server.audit import Anchors

Observer = Callable[[str, Envelope], None]
TO_HOSPITAL, FROM_HOSPITAL = "to_hospital", "from_hospital"
Task = TrainTask | EvaluateTask


class Pool:
    """The transport-independent part: envelopes in and out, shown to observers; subclasses carry them."""

    on_answer: Callable[[int], None] | None = None
    anchors: Anchors | None = None  # where the server keeps each hospital's outbound-log head (set by the loop)

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.observers: list[Observer] = list(observers)

    # what the loop calls -------------------------------------------------------------------------------------------
    def hello(self, message: Hello) -> dict[int, Message]:
        """Send ``message`` to every hospital this pool reaches; replies keyed by the client index they state."""
        envelope = encode(message)
        self._observe(TO_HOSPITAL, envelope)
        replies: dict[int, Message] = {}
        for key, reply in self._broadcast(envelope).items():
            decoded = self._receive_or_fail(key, reply)
            hospital = getattr(decoded, "client", key)
            if hospital in replies:
                raise FederationError(f"two hospitals answered as client {hospital}: give each its own index")
            replies[hospital] = decoded
        return replies

    def exchange(self, tasks: Mapping[int, Task]) -> dict[int, Message]:
        """Send each hospital its task; every client of ``tasks`` gets a reply or a ``Failure``."""
        envelopes = {c: encode(t) for c, t in tasks.items()}
        for envelope in envelopes.values():
            self._observe(TO_HOSPITAL, envelope)
        raw = self._send(envelopes)
        out: dict[int, Message] = {}
        for c in tasks:
            if c in raw:
                out[c] = self._receive_or_fail(c, raw[c])
            else:
                out[c] = Failure(c, "no answer", silent=True)
        return out

    def close(self) -> None:
        return None

    # what a transport implements -------------------------------------------------------------------------------------
    def _broadcast(self, envelope: Envelope) -> dict[int, Envelope]:
        raise NotImplementedError

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------------------------------
    def _answered(self, hospital: int) -> None:
        if self.on_answer is not None:
            self.on_answer(hospital)

    def _observe(self, direction: str, envelope: Envelope) -> None:
        for observer in self.observers:
            observer(direction, envelope)

    def _receive_or_fail(self, hospital: int, envelope: Envelope) -> Message:
        """A reply decoded, or a ``Failure`` naming why it cannot be read (the server never crashes on a reply).
        ``hospital``: the hospital it came from; negative before a hello reply names it (then the reply's own)."""
        try:
            message = self._receive(envelope)
        except Interrupted:
            raise
        except Exception as exc:
            return Failure(hospital, f"its reply cannot be read ({type(exc).__name__}: {first_line(exc)})")
        if self.anchors is not None:  # outside the try: a server that cannot write its own record stops
            sender = hospital if hospital >= 0 else getattr(message, "client", -1)
            behind = self.anchors.record(sender, envelope)
            if behind is not None:  # its outbound log went back: the reply is refused, the hospital named
                return Failure(sender, behind)
        return message

    def _receive(self, envelope: Envelope) -> Message:
        self._observe(FROM_HOSPITAL, envelope)
        header = envelope[0] if isinstance(envelope, tuple) and envelope else None
        if not isinstance(header, dict):
            raise FederationError("it is not a message (no header)")
        foreign = sorted(str(k)[:40] for k in header if k not in REPLY_FIELDS)
        if foreign:  # nothing but the contract's fields leaves a hospital or reaches the server's records
            raise FederationError(f"its header carries fields outside the contract ({', '.join(foreign[:3])})")
        if HEAD_FIELD in header:
            parse_head(header[HEAD_FIELD])
        return decode(envelope)
