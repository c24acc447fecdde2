"""The public names of docs/design.md ("Public names") still resolve, at their published modules, to the objects
the code uses: a module moved in a restructuring is re-exported at its old name."""

from __future__ import annotations

import importlib

import pytest

PUBLISHED = {
    "federation.aggregation": {
        "amp_coefficients": "federation.strategies.amp",
        "fisher_weights": "federation.strategies.fisher_weights",
        "weighted_sum": "federation.strategies.aggregation",
        "depthwise_fisher_weights": "federation.strategies.depthwise_fim",
        "lws_factors": "federation.strategies.wrappers.fedlws",
        "tlu_scores": "federation.strategies.wrappers.fedtlu",
        "precision_weighted_sum": "federation.strategies.precision_weighted",
    },
    "federation.contract": {
        name: "federation.wire.contract"
        for name in ("Hello", "HelloReply", "TrainTask", "TrainReply", "EvaluateTask", "EvaluateReply", "Failure")
    },
    "federation.engine.codec": {
        name: "federation.wire.codec" for name in ("encode", "decode", "to_bytes", "from_bytes")
    },
    "federation.engine.hospital": {"Hospital": "federation.hospital.handler", "Site": "federation.hospital.handler"},
}


@pytest.mark.parametrize("published", sorted(PUBLISHED))
def test_a_published_name_is_the_object_the_code_uses(published: str) -> None:
    module = importlib.import_module(published)
    names = PUBLISHED[published]
    assert len(names) >= 2
    for name, home in names.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), f"{published}.{name}"


def test_the_hospital_handles_a_message_through_its_published_names() -> None:
    from federation.contract import Hello
    from federation.engine.codec import decode, encode, from_bytes, to_bytes
    from federation.engine.hospital import Hospital

    assert callable(Hospital.handle)
    message = Hello("run-a", "[run]\n", False)
    assert decode(from_bytes(to_bytes(encode(message)))) == message
