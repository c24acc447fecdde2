"""FedTLU: targeted layer updates (Park & Joe-Wong; paper 003, Sec. 3 and Algorithm 1).

After the inner strategy has aggregated ``w_hat`` from the global model ``w^t``, each trainable parameter tensor
``i`` gets ``Score_i = ||Delta_i|| / (sqrt(n_i) std(Delta_i))`` with ``Delta = w_hat - w^t`` and the population
standard deviation (``tlu_scores``, below). A block is a layer unit (``models.split_units``);
its score is the mean of its tensors' scores (the paper sums them; within a group of identical blocks the two
rank alike, and the mean keeps blocks with different numbers of tensors comparable). Blocks are grouped, and in
each group only the ``ceil(portion * |G|)`` best-scoring blocks take the aggregate (ties: the earlier block);
the others keep ``w^t``, BatchNorm running statistics included (they follow their block). Blocks outside every
group (the paper's non-repeated input and output parts) always take the aggregate.

Grouping (``fedtlu.grouping``):

- ``body`` (default): the model's main body is one group. MobileNetV3-Small has only two pairs of identical
  blocks (``features.5-6``, ``features.10-11``), so the paper's rule barely selects anything; the body
  ``features.1 .. features.11`` (every ``features`` unit but the stem and the final convolution; ResNet's
  ``layerX.Y`` blocks) is pooled and ranked by mean tensor score, while the stem, ``features.12`` and the
  classifier are always updated (../shared/reference/seed-methods.md). A timm architecture (``timm/<name>``,
  `models.registry`) names its units by timm's own block grouping: its body is every ``blocks.*`` (MobileNet,
  EfficientNet), ``stages.*`` (ConvNeXt, RegNet and the like) or ``layerX.Y`` (ResNet) unit.
- ``shapes``: the paper's rule, blocks whose tuples of parameter shapes are identical form a group.

Only the shared part is in the aggregate, so only its blocks are selected. Clients report nothing extra: the
instructions are the inner strategy's. The fixed ``portion`` is the paper's from-scratch schedule; its
fine-tuning schedule (0.75 -> 0.5 -> 0.25 on a loss plateau) and the Random baseline are not implemented.
``aggregation.jsonl`` gets ``fedtlu``: each block's score, the groups, the blocks updated and those kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from itertools import accumulate, pairwise
from typing import Any

import torch

from federation.config import RunConfig
from federation.errors import FederationError
from federation.strategies.aggregation import _check_slices
from federation.strategies.context import StrategyContext
from federation.strategies.fedsaf import trainable_keys
from federation.strategies.flat import FlatSpec, flatten
from federation.strategies.wrappers.base import GlobalModelWrapper, finite_or_none
from federation.wire.contract import Strategy, TensorDict, TrainReply

_FEATURE = re.compile(r"features\.(\d+)")
_RESNET_BLOCK = re.compile(r"layer\d+\.\d+")
_TIMM_BLOCK = re.compile(r"(blocks|stages)\.\d+(\..+)?")  # timm's group_matcher units (models.registry)


def tlu_scores(update: torch.Tensor, tensors: Sequence[slice]) -> torch.Tensor:
    """FedTLU layer scores (Park & Joe-Wong, paper 003, Sec. 3 "Layer scoring"), float64 ``[T]``.

    For each parameter tensor ``i`` (a slice of the flat update ``Delta = w_hat - w^t``, ``n_i`` values):

        ``Score_i = ||Delta_i||_2 / (sqrt(n_i) * std(Delta_i))``

    with the *population* standard deviation, so ``Score_i = sqrt(1 + mean(Delta_i)^2 / var(Delta_i)) >= 1``:
    large when the tensor moved consistently in one direction. Where ``std = 0`` the ratio is undefined: a
    tensor that did not move scores 0 (never preferred), a non-zero constant update scores ``+inf`` (the limit
    of the formula: perfectly consistent).
    """
    if update.dim() != 1:
        raise ValueError(f"update must be a flat [d] vector, got shape {tuple(update.shape)}")
    bounds = _check_slices(tensors, update.numel(), "tensor")
    delta = update.detach().to(torch.float64)
    scores = torch.empty(len(bounds), dtype=torch.float64)
    for i, (start, stop) in enumerate(bounds):
        part = delta[start:stop]
        std = part.std(correction=0)
        norm = torch.linalg.vector_norm(part)
        if std > 0:
            scores[i] = norm / (math.sqrt(stop - start) * std)
        else:
            scores[i] = 0.0 if norm == 0 else math.inf
    return scores


def keep_count(portion: float, size: int) -> int:
    """``ceil(portion * size)``, at least 1, exact for decimal portions (0.3 * 10 is 3, not 4 as in floats)."""
    return max(1, math.ceil(Fraction(repr(portion)) * size))


def body_group(all_units: Sequence[str], blocks: Sequence[str]) -> list[list[str]]:
    """The ``body`` grouping: one group of the ``blocks`` in the model's main body (see the module docstring).

    ``all_units`` are all the model's unit names (the stem and the final convolution are found among them, so
    the body does not move with ``nhead``).
    """
    features = [name for name in all_units if _FEATURE.fullmatch(name)]
    inner = set(features[1:-1])
    body = [b for b in blocks if b in inner or _RESNET_BLOCK.fullmatch(b) or _TIMM_BLOCK.fullmatch(b)]
    return [body] if body else []


def shape_groups(shapes: Mapping[str, tuple[tuple[int, ...], ...]]) -> list[list[str]]:
    """The paper's grouping: blocks with identical tuples of parameter shapes, groups of two or more only."""
    groups: dict[tuple[tuple[int, ...], ...], list[str]] = {}
    for block, signature in shapes.items():
        groups.setdefault(signature, []).append(block)
    return [members for members in groups.values() if len(members) > 1]


class TargetedLayerUpdates(GlobalModelWrapper):
    """FedTLU around an averaging strategy; no cross-round state of its own (a fixed portion)."""

    label = "fedtlu"

    def __init__(
        self, inner: Strategy, ctx: StrategyContext, param_keys: set[str], portion: float, grouping: str
    ) -> None:
        super().__init__(inner, ctx, param_keys)
        if not 0.0 < portion <= 1.0:
            raise FederationError(f"fedtlu.portion must be in (0, 1], got {portion}")
        self.portion = portion
        self.grouping = grouping
        held = set(self.keys)
        trainable = set(self.param_keys)
        # A block is a unit's part of the global model (all of it, unless a setting keeps e.g. BatchNorm local).
        blocks = {name: [k for k in keys if k in held] for name, keys in ctx.units}
        self.blocks: dict[str, list[str]] = {name: keys for name, keys in blocks.items() if keys}
        state = inner.state_tensors()
        self.spec = FlatSpec.of(state, self.param_keys)
        bounds = list(accumulate(self.spec.numels, initial=0))
        self.tensors = [slice(a, b) for a, b in pairwise(bounds)]
        position = {k: i for i, k in enumerate(self.param_keys)}
        self.block_tensors = {name: [position[k] for k in keys if k in trainable] for name, keys in self.blocks.items()}
        if grouping == "body":
            self.groups = body_group([name for name, _ in ctx.units], list(self.blocks))
        elif grouping == "shapes":
            shapes = self.spec.shapes
            self.groups = shape_groups({name: tuple(shapes[i] for i in t) for name, t in self.block_tensors.items()})
        else:
            raise FederationError(f"fedtlu.grouping = {grouping!r}: use body or shapes")
        if not any(len(group) > 1 for group in self.groups):
            raise FederationError(
                f"fedtlu.grouping = {grouping} finds no group of two or more blocks among the shared units "
                f"{list(self.blocks)}, so nothing would ever be selected: use another fedtlu.grouping or strategy.nhead"
            )

    def settings(self) -> dict[str, Any]:
        return {"portion": self.portion, "grouping": self.grouping}

    def adjust(
        self, server_round: int, before: TensorDict, after: TensorDict, replies: Mapping[int, TrainReply]
    ) -> tuple[TensorDict, dict[str, Any]]:
        update = flatten([after], self.spec)[0] - flatten([before], self.spec)[0]
        scores = tlu_scores(update, self.tensors).tolist()
        block_score = {
            name: sum(scores[i] for i in members) / len(members) if members else 0.0
            for name, members in self.block_tensors.items()
        }
        order = {name: i for i, name in enumerate(self.blocks)}
        updated: list[str] = []
        kept: list[str] = []
        for group in self.groups:
            ranked = sorted(group, key=lambda b: (-block_score[b], order[b]))
            count = keep_count(self.portion, len(group))
            updated += ranked[:count]
            kept += ranked[count:]
        adjusted = dict(after)
        for block in kept:
            for key in self.blocks[block]:
                adjusted[key] = before[key]
        log = {
            "portion": self.portion,
            "grouping": self.grouping,
            "groups": self.groups,
            "scores": dict(zip(block_score, finite_or_none(list(block_score.values())), strict=True)),
            "updated": sorted(updated, key=order.__getitem__),
            "kept_previous": sorted(kept, key=order.__getitem__),
        }
        return adjusted, log


def wrap(inner: Strategy, config: RunConfig, ctx: StrategyContext) -> TargetedLayerUpdates:
    """FedTLU with the ``[fedtlu]`` settings around ``inner`` (refused unless ``inner`` keeps one global model)."""
    return TargetedLayerUpdates(inner, ctx, trainable_keys(config), config.fedtlu.portion, config.fedtlu.grouping)
