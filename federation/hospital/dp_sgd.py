"""DP-SGD as a wrapper around a training phase's optimiser (Abadi et al., "Deep Learning with Differential Privacy",
CCS 2016, Algorithm 1; the mechanism and its accounting: `federation.hospital.privacy`).

A DP phase takes ``epochs x round(1/q)`` steps. Each step Poisson-samples the hospital's privacy units
(`DPSGD.sampled`: one slide's tiles each, or one tile each), clips each sampled unit's gradient (the mean loss over
at most ``dp_tiles_per_unit`` of its tiles) to ``C`` and sums (`DPSGD.add`), then adds ``N(0, (sigma C)^2)``,
divides by ``q x units`` and lets the wrapped optimiser step (`DPSGD.step`). The proximal term's gradient depends
on no tile, so it is added after the noise, at no privacy cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from federation.errors import FederationError
from federation.hospital.data import HospitalData
from federation.hospital.privacy import clip_factor, gradient_norm, noised_mean, poisson_sample
from federation.wire.contract import Recipe


def privacy_units(data: HospitalData, recipe: Recipe) -> list[torch.Tensor]:
    """The training tiles of each privacy unit: one slide's tiles each (``dp_unit = "slide"``, from prepare's tile
    names), or one tile each."""
    if recipe.dp_unit == "tile":
        return [torch.tensor([i]) for i in range(data.num_train)]
    keys = data.train_units
    if keys is None:
        raise FederationError(
            f"hospital {data.hospital}: differential privacy by slide needs to know each training tile's slide, and "
            "this dataset's tile names do not say (prepare writes them): prepare the slides with gastric-fl prepare"
        )
    groups: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return [torch.tensor(groups[k]) for k in sorted(groups)]


class DPSGD:
    """DP-SGD around ``optimizer`` over the ``trained`` parameters: per step, `sampled` gives each sampled unit's
    tiles, `add` clips and sums the gradient of that unit's loss, `step` noises the sum into the mean gradient and
    steps. ``prox``: (parameter, centre) pairs of a proximal term, whose gradient ``prox_mu (w - centre)`` is added
    after the noise. Every draw (sampling, a unit's tiles, the noise) comes from ``generator``, in that order."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        trained: Sequence[nn.Parameter],
        recipe: Recipe,
        units: Sequence[torch.Tensor],
        generator: torch.Generator,
        prox: Sequence[tuple[nn.Parameter, torch.Tensor]] = (),
    ) -> None:
        self.optimizer = optimizer
        self.trained = list(trained)
        self.recipe = recipe
        self.units = list(units)
        self.generator = generator
        self.prox = list(prox)
        self.expected = recipe.dp_sample_rate * len(self.units)  # the divisor: q x units, whoever was sampled
        self._total: list[torch.Tensor] = []

    def sampled(self) -> Iterator[torch.Tensor]:
        """One step's sampled units, each as its training tiles (at most ``dp_tiles_per_unit``, drawn at random);
        starts the step's sum of clipped gradients."""
        recipe = self.recipe
        self._total = [torch.zeros_like(p) for p in self.trained]
        for u in poisson_sample(len(self.units), recipe.dp_sample_rate, self.generator).tolist():
            index = self.units[u]
            if index.numel() > recipe.dp_tiles_per_unit:
                index = index[torch.randperm(index.numel(), generator=self.generator)[: recipe.dp_tiles_per_unit]]
            yield index

    def add(self, loss: torch.Tensor) -> None:
        """Add the gradient of one unit's ``loss``, clipped to norm ``C`` (`clip_factor`), to the step's sum."""
        grads = torch.autograd.grad(loss, self.trained, allow_unused=True)
        grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(grads, self.trained, strict=True))
        factor = clip_factor(gradient_norm(grads), self.recipe.dp_max_grad_norm)
        for acc, g in zip(self._total, grads, strict=True):
            acc.add_(g, alpha=factor)

    def step(self) -> None:
        """Noise the step's sum into the mean gradient (`noised_mean`), add the proximal term's, and step."""
        recipe = self.recipe
        noised = noised_mean(
            self._total, recipe.dp_noise_multiplier, recipe.dp_max_grad_norm, self.expected, self.generator
        )
        self.optimizer.zero_grad(set_to_none=True)
        for p, g in zip(self.trained, noised, strict=True):
            p.grad = g.to(p.dtype)
        for p, c in self.prox:
            p.grad = p.grad + recipe.prox_mu * (p.detach() - c)  # type: ignore[operator]
        self.optimizer.step()
