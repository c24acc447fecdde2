"""A configuration error carries the key it is about (``FederationError.key``, ``"section.key"``), and its message is
the one it always was: one bad value per kind of check (a choice, a lower bound, a positive number, a range, a
type, an unknown key, the rules between sections, ``server.max_weight``, ``[privacy]``)."""

from __future__ import annotations

import pickle
import re
from collections.abc import Sequence

import pytest

from federation.config import load_config
from federation.errors import FederationError
from federation.methods import averaging_names


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        # a choice among names (_fail)
        (
            ["run.engine=grid"],
            "run.engine",
            "config run.engine = 'grid' is out of range: use one of local, flower-sim, flower",
        ),
        (
            ["strategy.bn=none"],
            "strategy.bn",
            "config strategy.bn = 'none' is out of range: use one of shared, local_stats, local",
        ),
        # a lower bound (_at_least)
        (["strategy.nhead=-1"], "strategy.nhead", "config strategy.nhead = -1 is out of range: use a value >= 0"),
        (["run.rounds=0"], "run.rounds", "config run.rounds = 0 is out of range: use a value >= 1"),
        # a finite positive number (_positive)
        (["amp.sigma=0"], "amp.sigma", "config amp.sigma = 0.0 is out of range: use a finite value > 0"),
        (["client.lr=-0.1"], "client.lr", "config client.lr = -0.1 is out of range: use a finite value > 0"),
        # a range of its own
        (
            ["client.momentum=1.0"],
            "client.momentum",
            "config client.momentum = 1.0 is out of range: use 0 <= momentum < 1",
        ),
        (
            ["fedtlu.portion=0"],
            "fedtlu.portion",
            "config fedtlu.portion = 0.0 is out of range: use a share of blocks in (0, 1], e.g. 0.5",
        ),
        # the wrong type (_coerce)
        (["run.rounds=2.5"], "run.rounds", "config run.rounds = 2.5 has the wrong type: expected int"),
        # a key the section does not have
        (
            ["run.colour=1"],
            "run.colour",
            "--set run.colour=1: unknown key run.colour; [run] accepts name, seed, rounds, device, engine, workers, "
            "threads, precision, deterministic, check_gpu_memory, keep_checkpoints, audit",
        ),
        # the rules between sections (config_from_dict)
        (
            ["strategy.name=precision_weighted"],
            "client.optimizer",
            "config client.optimizer = 'sgd' is out of range: precision_weighted needs it: it weights hospitals by "
            "Adam's second moments (paper 004 uses lr 0.001); set client.optimizer = adam",
        ),
        (
            ["adam.beta1=0.5"],
            "adam.beta1",
            "config adam.beta1 = 0.5 is out of range: leave [adam] at its defaults: they apply only with "
            'client.optimizer = "adam"',
        ),
        # server.max_weight: its range, its strategy, and 1/m for the hospitals listed
        (
            ["server.max_weight=1.5"],
            "server.max_weight",
            "config server.max_weight = 1.5 is out of range: use a share in (0, 1], e.g. 0.5",
        ),
        (
            ["strategy.name=separate", "server.max_weight=0.5"],
            "server.max_weight",
            "config server.max_weight = 0.5 does not apply to strategy separate: it shares nothing, so there is no "
            "aggregate whose weights to cap: leave server.max_weight unset",
        ),
        (
            ["strategy.name=fedsaf", "server.robust=norm_bound"],
            "server.robust",
            "config server.robust = 'norm_bound' is out of range: it bounds updates against one global model, which "
            f"strategy fedsaf does not have: use it with {averaging_names()}",  # today fedavg, fedprox, ..., fedas
        ),
        (
            ["strategy.clients=[0, 1, 2]", "server.max_weight=0.2"],
            "server.max_weight",
            "config server.max_weight = 0.2 is out of range: with 3 hospitals the weights sum to 1, so a cap below 1/3 "
            "cannot hold: use server.max_weight >= 0.333334 (or leave it unset: no cap)",
        ),
        # [privacy], whose keys are named one by one
        (
            ["privacy.noise_multiplier=1.0", "model.norm=group"],
            "privacy.max_grad_norm",
            "config privacy.max_grad_norm = None is out of range: set it: DP-SGD needs a clip norm and a sampling "
            "rate (docs/privacy.md)",
        ),
    ],
)
def test_a_configuration_error_carries_its_key_and_its_old_message(
    overrides: Sequence[str], key: str, message: str
) -> None:
    with pytest.raises(FederationError) as refused:
        load_config(None, overrides)
    assert refused.value.key == key
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "overrides",
    [["bogus.key=1"], ["rounds=3"]],  # an unknown section, an override without a key
)
def test_an_error_about_no_single_key_carries_none(overrides: Sequence[str]) -> None:
    with pytest.raises(FederationError) as refused:
        load_config(None, overrides)
    assert refused.value.key is None


def test_the_key_is_optional_and_survives_a_trip_between_processes() -> None:
    plain = FederationError("no key")
    assert plain.key is None
    assert str(plain) == "no key"
    keyed = pickle.loads(pickle.dumps(FederationError("bad nhead", key="strategy.nhead")))
    assert isinstance(keyed, FederationError)
    assert keyed.key == "strategy.nhead"
    assert str(keyed) == "bad nhead"


def test_a_set_value_cannot_smuggle_a_second_setting() -> None:
    """``--set 'client.lr=0.05\n[strategy]\nnhead=0'`` used to load 0.05 and drop the table without a word."""
    for text, says in [
        ("client.lr=0.05\n[strategy]\nnhead=0", "one setting per --set, on one line"),
        ("client.lr=0.05\r\nstrategy.nhead=0", "one setting per --set, on one line"),
    ]:
        with pytest.raises(FederationError, match=re.escape(says)):
            load_config(None, [text])
    assert load_config(None, ["client.lr=0.05"]).client.lr == 0.05
