"""What the server believes of a hospital's reply: nothing blindly (docs/design.md, "Trust model").

A training reply is aggregated only if its tensors are exactly the shared keys with the agreed shapes and dtypes and
finite, its example count is the one its Hello declared, and its scalars are in range (``train_problem``,
``usable_update``); an evaluation is recorded only on the same terms (``evaluation_problem``); the Hello replies must
agree on the class list (``agreed_classes``). Each check gives the one-line reason a hospital is left out of the round
(``None``: usable); the round loop (``federation.server.loop``) records it in ``aggregation.jsonl``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from federation.errors import FederationError
from federation.server.rounds import DP_METRICS, RoundRecord
from federation.wire.codec import Message
from federation.wire.contract import EvaluateReply, Failure, HelloReply, TrainReply

Spec = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


def _tensor_problem(what: str, key: str, value: torch.Tensor, spec: Spec) -> str | None:
    shape, dtype = spec[key]
    if tuple(value.shape) != shape or value.dtype != dtype:
        return (
            f"{what} {key} is {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}, expected {shape} "
            + str(dtype).removeprefix("torch.")
        )
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        return f"its update is not finite ({key})" if what == "tensor" else f"its {what} {key} is not finite"
    return None


def _in_range(value: Any, low: float, high: float) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and low <= value <= high
    )


def evaluation_problem(reply: EvaluateReply, declared_test: int | None) -> str | None:
    """Why an evaluation reply cannot be recorded (``None`` if it can): a test count other than the one the hospital
    declared in its Hello, or metrics out of range (loss finite and >= 0, accuracy and AUC in [0, 1]; AUC may be
    undefined, ``None``, for a one-class test split)."""
    if declared_test is not None and reply.num_examples != declared_test:
        return f"its evaluation reports {reply.num_examples} test examples, its hello declared {declared_test}"
    metrics = reply.metrics
    if not _in_range(metrics.get("loss"), 0.0, math.inf):
        return f"its test loss {metrics.get('loss')!r} is not a finite number >= 0"
    if not _in_range(metrics.get("acc"), 0.0, 1.0):
        return f"its test accuracy {metrics.get('acc')!r} is not in [0, 1]"
    auc = metrics.get("auc")
    if auc is not None and not _in_range(auc, 0.0, 1.0):
        return f"its test AUC {auc!r} is not in [0, 1]"
    return None


def usable_update(reply: TrainReply, shared_keys: list[str], spec: Spec, declared: int, fisher: bool) -> str | None:
    """Why ``reply`` cannot be aggregated (``None`` if it can; docs/design.md, "Trust model": the server believes
    nothing blindly): tensors other than exactly the shared keys with the agreed shapes and dtypes (``spec``), values
    that are not finite, an example count other than the one declared in its Hello, a training loss that is not a
    finite number >= 0, or a Fisher trace (when the recipe asked for one: ``fisher``) that is not finite and positive.
    A fused evaluation is judged apart (``evaluation_problem``)."""
    if set(reply.shared) != set(shared_keys):
        extra = sorted(set(reply.shared) - set(shared_keys))[:3]
        missing = sorted(set(shared_keys) - set(reply.shared))[:3]
        return f"sent other tensors than the shared part (extra {extra}, missing {missing})"
    for key, value in reply.shared.items():
        problem = _tensor_problem("tensor", key, value, spec)
        if problem:
            return problem
    for key, value in reply.second_moments.items():
        if key not in shared_keys:
            return f"its second moment {key} is not of a shared tensor"
        problem = _tensor_problem("second moment", key, value, spec)
        if problem:
            return problem
        if bool((value < 0).any()):
            return f"its second moment {key} has a negative value"
    if reply.num_examples <= 0:
        return "it reported no training examples"
    if reply.num_examples != declared:
        return f"it reports {reply.num_examples} training examples, its hello declared {declared}"
    loss = reply.metrics.get("train_loss")
    if loss is not None and not _in_range(loss, 0.0, math.inf):
        return f"its training loss {loss!r} is not a finite number >= 0"
    for key in DP_METRICS:
        if key in reply.metrics and not _in_range(reply.metrics[key], 0.0, math.inf):
            return f"its {key} {reply.metrics[key]!r} is not a finite number >= 0"
    if fisher:
        trace = reply.metrics.get("fisher_trace")
        if not _in_range(trace, 0.0, math.inf) or not trace:
            return f"its Fisher trace {trace!r} is not a finite positive number"
    return None


def train_problem(
    hospital: int, reply: Message, shared_keys: list[str], spec: Spec, counts: Mapping[int, int], fisher: bool
) -> str | None:
    """Why hospital ``hospital``'s answer to its training task cannot be aggregated (``None`` if it can): a
    ``Failure`` (its reason), another kind of message, a reply in another hospital's name, or an update that
    ``usable_update`` refuses (``counts``: the training examples each hospital declared in its Hello)."""
    if isinstance(reply, Failure):
        return reply.reason
    if not isinstance(reply, TrainReply):
        return f"answered a training task with {type(reply).__name__}"
    if reply.client != hospital:
        return f"its reply names hospital {reply.client}"
    return usable_update(reply, shared_keys, spec, counts[hospital], fisher)


def agreed_classes(hellos: Mapping[int, HelloReply]) -> tuple[str, ...]:
    """The class list every hospital of ``hellos`` reported (its dataset's, in class-index order); a
    ``FederationError`` of one line naming two hospitals that disagree."""
    first = min(hellos)
    classes = hellos[first].classes
    for c in sorted(hellos):
        if hellos[c].classes != classes:
            raise FederationError(
                f"the hospitals disagree on the classes: hospital {first} has {list(classes)}, hospital {c} has "
                f"{list(hellos[c].classes)}; prepare every hospital's data with the same class list "
                "(gastric-fl prepare --classes A,B,...)"
            )
    return classes


def take_previous(record: RoundRecord, replies: Mapping[int, Message], num_test: Mapping[int, int]) -> list[int]:
    """Take ``record``'s evaluations from the combined replies (``TrainReply.previous``), each recorded only on the
    terms of ``evaluation_problem``; a hospital whose message went unanswered is left out of the evaluation. Returns
    the hospitals to ask on their own (a failed or refused training, or a reply without the evaluation), so that
    they do not lose the evaluation of the round before."""
    again: list[int] = []
    for c, reply in sorted(replies.items()):
        if isinstance(reply, TrainReply) and reply.previous is not None:
            problem = evaluation_problem(reply.previous, num_test.get(c))
            if problem is None:
                record.evaluated[c] = reply.previous
            else:
                record.leave_out(c, problem, evaluation=True)
        elif isinstance(reply, Failure) and reply.silent:
            record.leave_out(c, reply.reason, evaluation=True)
        else:
            again.append(c)
    return again
