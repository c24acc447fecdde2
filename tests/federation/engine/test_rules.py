"""The hospital's rules (`federation.hospital.rules`), each alone: what it refuses, in one line naming the value, and
what it lets through; then the chains' order. Inbound rules first, then the outbound ones."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from federation.config import load_config
from federation.errors import Diverged, FederationError
from federation.hospital.policy import HospitalPolicy, PolicyRefusal
from federation.hospital.privacy import Accountant, LedgerEntry, planned_dp_steps, rdp_epsilon
from federation.hospital.rules import (
    EVALUATE_RULES,
    EVALUATED_RULES,
    TRAIN_REPLY_RULES,
    TRAIN_RULES,
    TRAINED_RULES,
    Asked,
    Leaving,
    agreed_keys,
    agreed_tensors,
    finite_evaluation,
    finite_model,
    privacy_as_agreed,
    privacy_budget,
    recipe_within_policy,
    run_outbound,
    run_rules,
    tensors_as_agreed,
)
from federation.strategies.context import recipe_from_config
from federation.wire.contract import EvaluateTask, Recipe, TrainInstruction, TrainReply, TrainTask

KEYS = ["a.weight", "a.bias"]
STATE = {"a.weight": torch.zeros(2, 3), "a.bias": torch.zeros(2), "head.weight": torch.zeros(1, 2)}
DP = ["privacy.noise_multiplier=1.0", "privacy.max_grad_norm=1.0", "privacy.sample_rate=0.5", "model.norm=group"]


def asked(policy: HospitalPolicy | None = None, *settings: str, ledger: Accountant | None = None) -> Asked:
    reads: list[int] = []

    def read() -> Accountant:
        reads.append(1)
        return ledger if ledger is not None else Accountant()

    found = Asked(policy or HospitalPolicy(), load_config(None, list(settings)), KEYS, STATE, read)
    found.reads = reads  # type: ignore[attr-defined]
    return found


def train(recipe: Recipe, shared: dict[str, torch.Tensor] | None = None, keys: list[str] = KEYS) -> TrainTask:
    return TrainTask("run", 2, 7, keys, TrainInstruction(0, recipe, shared=shared))


def test_agreed_keys_refuses_a_kept_key_and_a_missing_one() -> None:
    agreed_keys(asked(), train(Recipe()))
    with pytest.raises(PolicyRefusal, match=re.escape("asked for 1 tensor(s) this hospital keeps (head.weight)")):
        agreed_keys(asked(), train(Recipe(), keys=[*KEYS, "head.weight"]))
    with pytest.raises(PolicyRefusal, match=re.escape("differs from the agreed one (it lacks a.bias)")):
        agreed_keys(asked(), EvaluateTask("run", 1, 0, ["a.weight"], None))


def test_recipe_within_policy_applies_to_training_only() -> None:
    recipe_within_policy(asked(), train(Recipe()))
    with pytest.raises(PolicyRefusal, match=re.escape("recipe lr = 5.0 is outside this hospital's range (0, 1.0]")):
        recipe_within_policy(asked(), train(Recipe(lr=5.0)))
    recipe_within_policy(asked(), EvaluateTask("run", 1, 0, KEYS, None))  # an evaluation carries no recipe


def test_privacy_as_agreed_compares_with_the_hellos_configuration() -> None:
    dp = asked(None, *DP)
    agreed = recipe_from_config(dp.config)
    privacy_as_agreed(dp, train(agreed))
    with pytest.raises(PolicyRefusal, match=re.escape("noise_multiplier 0.5 differs from the run's agreed 1.0")):
        privacy_as_agreed(dp, train(replace(agreed, dp_noise_multiplier=0.5)))


def test_privacy_budget_reads_the_ledger_only_when_the_policy_has_a_budget() -> None:
    plain = asked(None, *DP)
    privacy_budget(plain, train(recipe_from_config(plain.config)))
    assert plain.reads == []  # type: ignore[attr-defined]  # no budget: the ledger is not even read
    recipe = recipe_from_config(plain.config)
    steps = planned_dp_steps(recipe)
    spent = Accountant([LedgerEntry(1, 1.0, 0.5, steps, "slide", 8, 1.0, 1e-5)])
    one, two = rdp_epsilon([(1.0, 0.5, steps)], 1e-5), rdp_epsilon([(1.0, 0.5, 2 * steps)], 1e-5)
    enough = asked(HospitalPolicy(max_epsilon=two + 1e-9), *DP, ledger=spent)
    privacy_budget(enough, train(recipe))
    short = asked(HospitalPolicy(max_epsilon=(one + two) / 2), *DP, ledger=spent)
    with pytest.raises(PolicyRefusal, match=re.escape(f"epsilon {one:.3f} so far, {two:.3f} after this round")):
        privacy_budget(short, train(recipe))
    assert short.reads == [1]  # type: ignore[attr-defined]


def test_tensors_as_agreed_checks_the_shared_part_and_the_centre() -> None:
    good = {"a.weight": torch.ones(2, 3), "a.bias": torch.ones(2)}
    tensors_as_agreed(asked(), train(Recipe(), good))
    with pytest.raises(PolicyRefusal, match=re.escape("the shared part sent tensor a.bias is not finite")):
        tensors_as_agreed(asked(), train(Recipe(), {**good, "a.bias": torch.tensor([1.0, float("nan")])}))
    instruction = TrainInstruction(0, Recipe(prox_mu=1.0), shared=good, prox_centre={"a.weight": torch.ones(3)})
    centre = TrainTask("run", 2, 7, KEYS, instruction)
    with pytest.raises(PolicyRefusal, match=re.escape("the proximal centre sent tensor a.weight is (3,)")):
        tensors_as_agreed(asked(), centre)
    with pytest.raises(PolicyRefusal, match=re.escape("names tensors outside the shared part (head.weight)")):
        tensors_as_agreed(asked(), EvaluateTask("run", 1, 0, KEYS, {"head.weight": torch.zeros(1, 2)}))


def test_the_chains_run_in_order_and_stop_at_the_first_refusal() -> None:
    assert (agreed_keys, recipe_within_policy, privacy_as_agreed, privacy_budget, tensors_as_agreed) == TRAIN_RULES
    assert (agreed_keys, tensors_as_agreed) == EVALUATE_RULES
    # a kept key and a bad learning rate: the keys' rule comes first and names its refusal
    bad = train(Recipe(lr=5.0), keys=[*KEYS, "head.weight"])
    with pytest.raises(PolicyRefusal, match="this hospital keeps"):
        run_rules(TRAIN_RULES, asked(), bad)
    run_rules(TRAIN_RULES, asked(), train(Recipe(), {"a.weight": torch.ones(2, 3), "a.bias": torch.ones(2)}))


def leaving(
    how: str | None = None, *, nan: bool = False, reply: TrainReply | None = None, loss: float | None = None
) -> Leaving:
    model = torch.nn.Linear(3, 2)
    if nan:
        with torch.no_grad():
            model.bias.fill_(float("nan"))
    return Leaving(0, 3, model, ["weight", "bias"], how, reply, loss)


def test_finite_model_refuses_a_diverged_model_it_has_not_checked_yet() -> None:
    finite_model(leaving("after training"))
    finite_model(leaving(None, nan=True))  # a model already checked (trained, a checkpoint): not read again
    with pytest.raises(Diverged, match=re.escape("hospital 0: its model became not finite after training (bias)")):
        finite_model(leaving("after training", nan=True))


def test_agreed_tensors_refuses_a_reply_with_other_tensors() -> None:
    shared = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}
    agreed_tensors(leaving())  # nothing to send
    agreed_tensors(leaving(reply=TrainReply(0, shared, 4, second_moments={"bias": torch.ones(2)})))
    for reply in (
        TrainReply(0, {"weight": torch.zeros(2, 3)}, 4),
        TrainReply(0, shared, 4, second_moments={"head": torch.ones(2)}),
    ):
        with pytest.raises(FederationError, match="its reply would carry other tensors than agreed"):
            agreed_tensors(leaving(reply=reply))


def test_finite_evaluation_refuses_a_non_finite_loss() -> None:
    finite_evaluation(leaving(loss=0.5))
    with pytest.raises(Diverged, match=re.escape("round 3's model is not finite (loss nan); it was not kept")):
        finite_evaluation(leaving(loss=float("nan")))


def test_the_outbound_chains_run_in_order() -> None:
    assert (finite_model,) == TRAINED_RULES
    assert (agreed_tensors,) == TRAIN_REPLY_RULES
    assert (finite_model, finite_evaluation) == EVALUATED_RULES
    # a model loaded from what was sent, not finite, and a non-finite loss: the model's rule comes first
    with pytest.raises(Diverged, match="its model became not finite with what it was sent"):
        run_outbound(EVALUATED_RULES, leaving("with what it was sent", nan=True, loss=float("nan")))
    run_outbound(EVALUATED_RULES, leaving("with what it was sent", loss=0.5))
