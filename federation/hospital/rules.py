"""A hospital's rules as chains: the named, ordered checks it runs on every task before it restores, trains, loads,
writes or sends anything (inbound), and before what the task produced is kept or leaves it (outbound)
(docs/design.md, "Trust model"; in the spirit of NVFlare's task filters).

Each rule looks at one thing and refuses (inbound: ``PolicyRefusal``, one line naming the rule's value; outbound:
``Diverged`` or ``FederationError``) or passes; none changes anything. The inbound chains:

- `TRAIN_RULES`: the shared keys asked for are the agreed ones (`agreed_keys`), the recipe is within the
  hospital's policy (`recipe_within_policy`), its DP-SGD is the one the run agreed at the Hello
  (`privacy_as_agreed`), the round fits the hospital's privacy budget (`privacy_budget`), and the tensors sent are
  the agreed model's, finite (`tensors_as_agreed`).
- `EVALUATE_RULES`: `agreed_keys`, then `tensors_as_agreed`.

The outbound chains run before what a task produced is kept or leaves the hospital, on a `Leaving`:

- `TRAINED_RULES`, after training, before the round's privacy ledger entry and checkpoint: the model is finite
  (`finite_model`; a diverged training is never kept).
- `TRAIN_REPLY_RULES`, before the checkpoint and the reply: the reply carries the agreed tensors and no others
  (`agreed_tensors`).
- `EVALUATED_RULES`, after an evaluation, before its predictions, checkpoint and bundle: the model loaded from what
  was sent is finite (`finite_model`) and so is the evaluation's loss (`finite_evaluation`).

An inbound rule sees `Asked`: the hospital's policy, the run's configuration as accepted at the Hello, the keys it
agreed to share, the agreed model's tensors (names, shapes, dtypes) and its privacy ledger, read only when a rule
needs it. Adding a rule (inbound or outbound) is a function here and its place in a chain;
`tests/federation/engine/test_rules.py` checks each alone. Which message is addressed to which hospital, and the
Hello's own checks (`check_config`, the dataset, a resume's settings), stay with the hospital
(`federation.hospital.handler`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from federation.config import RunConfig
from federation.errors import Diverged, FederationError
from federation.hospital.policy import (
    HospitalPolicy,
    PolicyRefusal,
    check_agreed_privacy,
    check_budget,
    check_recipe,
    check_tensors,
)
from federation.hospital.privacy import Accountant, planned_dp_steps
from federation.wire.contract import EvaluateTask, TrainReply, TrainTask

Task = TrainTask | EvaluateTask


@dataclass
class Asked:
    """What a rule may look at: the hospital's ``policy``, the run's ``config`` as accepted at the Hello, the
    ``keys`` it agreed to share, the agreed model's ``state`` (for names, shapes and dtypes) and ``read_ledger``, its
    privacy ledger for the run (read once, when a rule asks)."""

    policy: HospitalPolicy
    config: RunConfig
    keys: Sequence[str]
    state: Mapping[str, torch.Tensor]
    read_ledger: Callable[[], Accountant]

    @cached_property
    def ledger(self) -> Accountant:
        """The hospital's ledger (checked against its anchor by ``read_ledger``)."""
        return self.read_ledger()


Rule = Callable[[Asked, Task], None]


def agreed_keys(asked: Asked, task: Task) -> None:
    """The server's list of shared keys must be the one this hospital computed (it sends its own, never the server's
    list): asking for a key it keeps (its head, its BatchNorm statistics) or leaving one out is refused."""
    keys = set(asked.keys)
    if set(task.shared_keys) == keys:
        return
    extra = sorted(set(task.shared_keys) - keys)
    if extra:
        raise PolicyRefusal(
            f"refused by {asked.policy.source}: the server asked for {len(extra)} tensor(s) this hospital keeps "
            f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''})"
        )
    missing = sorted(keys - set(task.shared_keys))
    raise PolicyRefusal(
        f"refused by {asked.policy.source}: the server's shared part differs from the agreed one "
        f"(it lacks {', '.join(missing[:3])})"
    )


def recipe_within_policy(asked: Asked, task: Task) -> None:
    """Every number of the training recipe finite and within the policy's bounds (`check_recipe`)."""
    if isinstance(task, TrainTask):
        check_recipe(asked.policy, task.instruction.recipe)


def privacy_as_agreed(asked: Asked, task: Task) -> None:
    """The round's DP-SGD is exactly the run's ``[privacy]`` accepted at the Hello (`check_agreed_privacy`)."""
    if isinstance(task, TrainTask):
        check_agreed_privacy(asked.policy, task.instruction.recipe, asked.config)


def privacy_budget(asked: Asked, task: Task) -> None:
    """Under a policy with ``max_epsilon``: the round is DP-SGD and the hospital's epsilon after it, from its own
    ledger and the most steps the round can take, stays within the budget (`check_budget`)."""
    if not isinstance(task, TrainTask) or asked.policy.max_epsilon is None:
        return
    recipe = task.instruction.recipe
    spent, after = 0.0, None
    if recipe.private:
        spent = asked.ledger.epsilon(recipe.dp_delta)
        steps = planned_dp_steps(recipe)
        after = asked.ledger.epsilon_after(recipe.dp_noise_multiplier, recipe.dp_sample_rate, steps, recipe.dp_delta)
    check_budget(asked.policy, recipe, spent, after)


def tensors_as_agreed(asked: Asked, task: Task) -> None:
    """Every tensor sent (the shared part, a proximal centre) is an agreed key with the agreed model's shape and
    dtype, and finite (`check_tensors`)."""
    if isinstance(task, TrainTask):
        sent = [
            ("the shared part sent", task.instruction.shared),
            ("the proximal centre sent", task.instruction.prox_centre),
        ]
    else:
        sent = [("the shared part sent", task.shared)]
    for what, tensors in sent:
        check_tensors(asked.policy, what, tensors, asked.state, asked.keys)


TRAIN_RULES: tuple[Rule, ...] = (
    agreed_keys,
    recipe_within_policy,
    privacy_as_agreed,
    privacy_budget,
    tensors_as_agreed,
)
EVALUATE_RULES: tuple[Rule, ...] = (agreed_keys, tensors_as_agreed)


def run_rules(rules: Sequence[Rule], asked: Asked, task: Task) -> None:
    """Apply ``rules`` in order; the first that refuses stops the task (``PolicyRefusal``)."""
    for rule in rules:
        rule(asked, task)


# -- outbound: what the hospital checks before anything is kept or leaves -------------------------------------------
@dataclass
class Leaving:
    """What an outbound rule looks at: the ``hospital``'s index, the round, its ``model`` as it stands, the ``keys``
    it agreed to share, how the model came to be (``how``: ``"after training"``, ``"with what it was sent"``;
    ``None``: a model already checked, just trained or a checkpoint), and what is about to be kept or leave: a
    training ``reply`` or an evaluation's ``loss``."""

    hospital: int
    server_round: int
    model: nn.Module
    keys: Sequence[str]
    how: str | None = None
    reply: TrainReply | None = None
    loss: float | None = None


OutboundRule = Callable[[Leaving], None]


def finite_model(leaving: Leaving) -> None:
    """Never checkpoint or deploy a model with a value that is not finite (a diverged training): `Diverged`."""
    if leaving.how is None:
        return
    for key, value in leaving.model.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise Diverged(
                f"hospital {leaving.hospital}: its model became not finite {leaving.how} ({key}); it was not kept, "
                "its last good model stays"
            )


def agreed_tensors(leaving: Leaving) -> None:
    """A training reply carries exactly the agreed shared tensors, and second moments of agreed ones only."""
    reply = leaving.reply
    if reply is None:
        return
    keys = set(leaving.keys)
    if set(reply.shared) != keys or not set(reply.second_moments) <= keys:
        raise FederationError(f"hospital {leaving.hospital}: its reply would carry other tensors than agreed")


def finite_evaluation(leaving: Leaving) -> None:
    """An evaluation whose loss is not finite is neither kept nor deployed nor sent: `Diverged`."""
    if leaving.loss is not None and not math.isfinite(leaving.loss):
        raise Diverged(
            f"hospital {leaving.hospital}: the evaluation of round {leaving.server_round}'s model is not finite "
            f"(loss {leaving.loss}); it was not kept or deployed, its last good model stays"
        )


TRAINED_RULES: tuple[OutboundRule, ...] = (finite_model,)
TRAIN_REPLY_RULES: tuple[OutboundRule, ...] = (agreed_tensors,)
EVALUATED_RULES: tuple[OutboundRule, ...] = (finite_model, finite_evaluation)


def run_outbound(rules: Sequence[OutboundRule], leaving: Leaving) -> None:
    """Apply the outbound ``rules`` in order; the first that refuses stops what was to be kept or sent."""
    for rule in rules:
        rule(leaving)
