"""Envelopes in Flower records: the one form in which every message crosses Flower (Flower 1.41 Message API;
docs/design.md, "Messages, strategies and engines"). Used by both sides: the server's ``FlowerPool``
(``federation.flower.apps``) and the hospital's ``ClientApp`` and executor (``federation.flower.hospital_app``,
``federation.flower.executor``).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, RecordDict

from federation.errors import first_line
from federation.wire.codec import Envelope, from_bytes, to_bytes

ENVELOPE, WIRE, ORDER = "envelope", "bytes", "order"
MESSAGE_TYPES = {"hello": "query", "train": "train", "evaluate": "evaluate"}


def to_record(envelope: Envelope) -> RecordDict:
    """An envelope as a ``RecordDict``: one ``ConfigRecord`` holding the envelope's wire form (`codec.to_bytes`:
    JSON header, then every tensor in one safetensors body) and the tensors' order.

    One object for the whole message: Flower 1.41 stores and moves every ``Array`` of an ``ArrayRecord`` as an object
    of its own, one HTTP request and one database round trip at the SuperLink each (measured: a shared part of ~100
    tensors made the SuperLink the busiest process of a deployed round); the values carried are the same.
    """
    order = list(envelope[1])  # safetensors stores tensors in its own order; the envelope's is kept beside
    return RecordDict({ENVELOPE: ConfigRecord({WIRE: to_bytes(envelope), ORDER: order})})


def from_record(record: RecordDict) -> Envelope:
    """Inverse of ``to_record``; never raises. A record that is not one envelope comes back as an envelope of kind
    ``unreadable: <why>``, which the receiving side's decoding refuses like any malformed message (the hospital
    answers that it cannot read it; the server leaves that hospital out of the round)."""
    try:
        data = record.config_records[ENVELOPE][WIRE]
        if not isinstance(data, bytes):
            raise TypeError(f"{WIRE!r} holds {type(data).__name__}, not bytes")
        header, tensors = from_bytes(data)
        order = record.config_records[ENVELOPE].get(ORDER, [])
        if not isinstance(order, list) or sorted(map(str, order)) != sorted(tensors):
            raise ValueError("its tensor order does not name exactly its tensors")
        return header, {str(k): tensors[str(k)] for k in order}
    except Exception as exc:  # untrusted input: JSON, safetensors or record errors alike
        return {"kind": f"unreadable: not one gastric-fl message ({first_line(exc)})"}, {}
