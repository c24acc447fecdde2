"""A divergence is a kind of failure, not a phrase: the hospital's ``Failure`` says ``diverged`` (its training or
evaluation became non-finite), and only then does a round that no hospital completed end with the advice to lower
the learning rate. A refusal that mentions a non-finite tensor (the server sent NaN) is not a divergence."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support.tiny_dataset import TINY_SETTINGS

from federation.config import load_config
from federation.engine import Server, local_sites, resolve_config
from federation.engine.pools import InProcessPool
from federation.errors import FederationError
from federation.server.pool import Pool
from federation.wire.codec import Envelope, decode, encode
from federation.wire.contract import Failure


def test_the_failure_says_whether_it_diverged_and_other_failures_travel_as_before() -> None:
    diverged = encode(Failure(1, "hospital 1: its model became not finite", diverged=True))
    assert diverged[0]["diverged"] is True
    back = decode(diverged)
    assert isinstance(back, Failure)
    assert back.diverged
    plain = encode(Failure(1, "refused by the hospital: tensor x is not finite"))
    assert "diverged" not in plain[0]  # the envelope of every other failure is unchanged
    again = decode(plain)
    assert isinstance(again, Failure)
    assert not again.diverged
    forged = decode(({**plain[0], "diverged": "yes"}, {}))  # only a JSON true says so
    assert isinstance(forged, Failure)
    assert not forged.diverged


class FailingPool(InProcessPool):
    """Every hospital answers its training task with the same failure."""

    def __init__(self, sites: Any, failure: Failure) -> None:
        super().__init__(sites)
        self.failure = failure

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        out = super()._send(envelopes)
        for c, (header, _) in out.items():
            if header.get("kind") == "train_reply":
                out[c] = encode(Failure(c, self.failure.reason, diverged=self.failure.diverged))
        return out


@pytest.mark.parametrize(
    ("failure", "advice"),
    [
        (Failure(0, "hospital: the training loss became nan; lower client.lr", diverged=True), True),
        (Failure(0, "refused by the hospital: shared tensor features.0.0.weight is not finite"), False),
    ],
)
def test_only_a_divergence_gets_the_advice_to_lower_the_learning_rate(
    dataset: Path, tmp_path: Path, failure: Failure, advice: bool
) -> None:
    config = resolve_config(load_config(None, [*TINY_SETTINGS, "run.rounds=1"], data=dataset))
    sites = local_sites(config, tmp_path / "run")

    def make_pool() -> Pool:
        return FailingPool(sites, failure)

    with pytest.raises(FederationError) as info:
        Server(config, tmp_path / "run", progress=False).run(make_pool)
    message = str(info.value)
    assert message.startswith("round 1: no hospital sent a usable update")
    assert ("the training diverged" in message) is advice
    assert ("start a new run with a lower client.lr" in message) is advice
