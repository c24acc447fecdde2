"""A reply that would break the round is named and left out; the round goes on with the others (docs/design.md,
"Trust model": the server believes nothing blindly).

`federation.server.checks` refuses a reply the server cannot believe on its own (wrong tensors, NaN, a count other
than its Hello's). Two things can still break a round with replies that each look well formed:

- **A Hello whose counts are not counts** (``hello_problem``): negative, beyond 2^53 (no float holds it exactly),
  or above ``server.max_examples`` when set. The hospital is left out of the run before round 1, in one line.
- **An update so large that the aggregate overflows** (``aggregate_or_leave_out``): a finite update scaled by
  1e30 averages into a finite global model whose values' squares overflow float32, so that every hospital's next
  training or evaluation fails and the run stops a round later naming nobody. After each aggregation the server
  checks the strategy's new state (``state_problem``: finite, and every value within ``OVERFLOW_LIMIT``); if it is
  not sound, the reply holding the largest value is left out with the reason, the strategy's state is put back as
  it was before the round (the checkpoint's own ``state_tensors``/``load_state_tensors``), and the round is
  aggregated again without it, until it is sound or no reply is left.

An honest round passes both checks and its aggregate is the strategy's, bit for bit. What this does not catch is an
update large enough to harm but not to overflow (scaled by 50, say): ``server.robust`` is for that
(docs/federation.md, "Robust aggregation").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from federation.config import MAX_COUNT
from federation.wire.contract import HelloReply, Strategy, TrainReply

# sqrt(float32's largest value, 3.4e38) = 1.84e19: a model value beyond it has a square that overflows float32
# (BatchNorm's variance, weight decay, the L2 distances of AMP and norm bounding), so no model holds one honestly.
OVERFLOW_LIMIT = 1.8e19


def hello_problem(reply: HelloReply, max_examples: int | None) -> str | None:
    """Why the counts a Hello declares cannot be believed (``None`` if they can): a training or test count that is
    not a whole number in ``[0, 2^53]``, or above ``max_examples`` (``server.max_examples``) when that is set."""
    for what, value in (("training", reply.num_train), ("test", reply.num_test)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            return f"its hello declares {value!r} {what} tiles, which is not a count (a whole number in [0, 2^53])"
        if max_examples is not None and value > max_examples:
            return (
                f"its hello declares {value} {what} tiles, more than server.max_examples = {max_examples}; "
                "raise server.max_examples if that many is real"
            )
    return None


def state_problem(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """Why a strategy's state after aggregation is not a model any hospital can use (``None`` if it is): a
    floating-point value that is not finite, or beyond ``OVERFLOW_LIMIT`` in size (its square overflows float32)."""
    for key, value in tensors.items():
        if not value.is_floating_point() or value.numel() == 0:
            continue
        if not bool(torch.isfinite(value).all()):
            return f"not finite ({key})"
        largest = float(value.detach().abs().max())
        if largest > OVERFLOW_LIMIT:
            return f"overflow ({key} reaches {largest:.3g}, beyond {OVERFLOW_LIMIT:.2g}: its square overflows float32)"
    return None


def largest_value(reply: TrainReply) -> float:
    """The largest absolute value among a reply's floating-point shared tensors (float64; 0 when it shares none)."""
    sizes = [
        float(v.detach().to(torch.float64).abs().max())
        for v in reply.shared.values()
        if v.is_floating_point() and v.numel()
    ]
    return max(sizes, default=0.0)


def _snapshot(strategy: Strategy) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return {k: v.detach().clone() for k, v in strategy.state_tensors().items()}, strategy.state_json()


def aggregate_or_leave_out(
    strategy: Strategy, server_round: int, replies: Mapping[int, TrainReply]
) -> tuple[dict[str, Any], dict[int, str]]:
    """``strategy.aggregate_train`` over ``replies``, leaving out each reply that makes the aggregate unsound.

    Returns the strategy's record for the replies it kept and ``{client: reason}`` for those left out (empty for a
    sound round, whose aggregate is the strategy's own). After an unsound aggregate (``state_problem``, or an
    ``ArithmeticError`` in the maths) the reply with the largest value (``largest_value``; the lower client on a
    tie) is left out, the strategy's state is restored and the round aggregated again. When no reply is left the
    record is empty and every client is in the reasons: the caller stops the run naming them.
    """
    kept = dict(replies)
    dropped: dict[int, str] = {}
    saved = _snapshot(strategy)
    while kept:
        try:
            record = strategy.aggregate_train(server_round, kept)
        except ArithmeticError as exc:
            problem = f"fail ({type(exc).__name__}: {exc})"
        else:
            found = state_problem(strategy.state_tensors())
            if found is None:
                return record, dropped
            problem = found
        sizes = {c: largest_value(kept[c]) for c in sorted(kept)}
        culprit = max(sizes, key=lambda c: sizes[c])  # max keeps the first of equals: the lowest client
        others = max((v for c, v in sizes.items() if c != culprit), default=math.nan)
        dropped[culprit] = (
            f"its update (largest value {sizes[culprit]:.3g}; the others' at most {others:.3g}) makes the "
            f"aggregate {problem}; left out of this round's aggregate"
        )
        del kept[culprit]
        strategy.load_state_tensors(saved[0])
        strategy.load_state_json(saved[1])
    return {}, dropped
