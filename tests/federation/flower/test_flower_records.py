"""A message on Flower is one object: the envelope's wire form in one ``ConfigRecord`` (``federation.flower.apps``),
read back exactly, and a record that is not one envelope is refused by the receiving side, never a crash."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from federation.errors import FederationError
from federation.flower.records import ENVELOPE, WIRE, from_record, to_record
from federation.wire.codec import decode, encode, envelope_digest
from federation.wire.contract import Failure


def test_an_envelope_travels_as_one_object_and_comes_back_exactly() -> None:
    tensors = {
        "shared/a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
        "shared/b.running_mean": torch.tensor([1.5, -2.25]),
        "shared/c.num_batches_tracked": torch.tensor(5, dtype=torch.int64),
    }
    envelope = ({"kind": "train_reply", "client": 2, "loss": 0.125}, tensors)
    record = to_record(envelope)
    assert list(record.config_records) == [ENVELOPE]
    assert not record.array_records  # no per-tensor objects
    assert isinstance(record.config_records[ENVELOPE][WIRE], bytes)
    header, back = from_record(record)
    assert header == envelope[0]
    assert list(back) == list(tensors)
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype
        assert torch.equal(back[key], value)
    assert envelope_digest((header, back)) == envelope_digest(envelope)


def test_a_record_that_is_not_one_envelope_is_refused_when_decoded() -> None:
    foreign = [
        RecordDict({"tensors": ArrayRecord(torch_state_dict={"x": torch.zeros(2)})}),  # the old per-tensor form
        RecordDict({ENVELOPE: ConfigRecord({WIRE: "text, not bytes"})}),
        RecordDict({ENVELOPE: ConfigRecord({WIRE: b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}"})}),
        RecordDict({ENVELOPE: ConfigRecord({WIRE: (2).to_bytes(8, "little") + b"{}" + b"not safetensors"})}),
    ]
    for record in foreign:
        header, tensors = from_record(record)
        assert str(header["kind"]).startswith("unreadable: not one gastric-fl message")
        assert tensors == {}
        # what Hospital.answer and the server's reply check turn into a failure
        with pytest.raises(FederationError, match="unknown message kind"):
            decode((header, tensors))
    # and a failure reply, the smallest envelope, still makes the round trip
    failure = encode(Failure(1, "refused by the hospital: no"))
    assert from_record(to_record(failure)) == failure
