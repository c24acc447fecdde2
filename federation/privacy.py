"""Differential privacy at a hospital: DP-SGD with slides as the protected unit, and its accounted budget (issue 22).

DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Algorithm 1), with the unit of privacy a
*slide* (a patient's slide gives many correlated tiles, so a tile-level guarantee says little about a patient):

1. **Sampling** (`poisson_sample`): each step takes every slide of the hospital's training split independently with
   probability ``q`` (``privacy.sample_rate``): Poisson sampling, the setting the accountant assumes.
2. **Per-slide gradient**: for each sampled slide, the gradient of the mean cross-entropy over (at most
   ``privacy.tiles_per_unit``, drawn at random) of its tiles, with respect to every parameter the phase trains.
3. **Clipping** (`clip_factor`): each slide's gradient, taken as one vector over all those parameters, is scaled by
   ``min(1, C / (||g|| + 1e-6))`` (Opacus's rule) so that its norm is at most ``C`` (``privacy.max_grad_norm``).
4. **Noise** (`noised_mean`): the clipped gradients are summed, Gaussian noise of standard deviation ``sigma * C``
   (``privacy.noise_multiplier``) is added to every coordinate, and the sum is divided by the *expected* number of
   slides per step, ``q * N`` (so the divisor does not depend on who was sampled), then the optimiser steps.

``privacy.unit = "tile"`` makes each tile its own unit (for comparison only: it protects a tile, not a patient).

**Accounting** (`Accountant`): the Rényi-DP accountant of Opacus (``opacus.accountants.RDPAccountant``, Mironov
2017; the subsampled Gaussian of Mironov, Talwar and Zhang 2019), never hand-written. Each hospital's history of
``(noise multiplier, sample rate, steps)`` is kept in its own folder (`ACCOUNTANT_FILE`) and survives resume; epsilon
at ``privacy.delta`` after every round is what the hospital reports and records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from federation.runfiles import ACCOUNTANT_FILE as ACCOUNTANT_FILE  # named with the run's other files

if TYPE_CHECKING:
    from federation.contract import Recipe

ACCOUNTANT_NAME = "opacus RDPAccountant"
CLIP_EPSILON = 1e-6  # Opacus adds it to the norm before dividing


def poisson_sample(units: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of the units taken this step: each of ``units`` independently with probability ``rate`` (Poisson
    sampling, drawn from ``generator``); may be empty."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"sample rate must be in (0, 1], got {rate}")
    return torch.nonzero(torch.rand(units, generator=generator) < rate).flatten()


def clip_factor(norm: float, max_norm: float) -> float:
    """The factor that brings a gradient of L2 norm ``norm`` within ``max_norm``: ``min(1, C / (norm + 1e-6))``."""
    return min(1.0, max_norm / (norm + CLIP_EPSILON))


def gradient_norm(grads: Sequence[torch.Tensor]) -> float:
    """The L2 norm of a gradient given as tensors (one per parameter), taken as one vector."""
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))


def noised_mean(
    clipped_sum: Sequence[torch.Tensor],
    noise_multiplier: float,
    max_norm: float,
    expected_units: float,
    generator: torch.Generator,
) -> list[torch.Tensor]:
    """``(sum of clipped gradients + N(0, (sigma C)^2 I)) / (q N)``: the DP-SGD update direction (step 4 above)."""
    if expected_units <= 0:
        raise ValueError(f"the expected number of units per step must be positive, got {expected_units}")
    std = noise_multiplier * max_norm
    out = []
    for total in clipped_sum:
        noise = torch.normal(0.0, std, size=total.shape, generator=generator).to(total.dtype) if std > 0 else 0.0
        out.append((total + noise) / expected_units)
    return out


def steps_per_epoch(sample_rate: float) -> int:
    """DP-SGD steps that make one epoch in expectation: ``round(1 / q)`` (each unit is seen once per epoch on
    average)."""
    return max(1, round(1.0 / sample_rate))


def planned_dp_steps(recipe: Recipe) -> int:
    """The most DP-SGD steps a round of ``recipe`` takes: ``round(1 / q)`` per
    epoch of its phases (head and base); the budget check uses it before training (the head phase is skipped when
    a model keeps no head, so the steps taken can be fewer, never more)."""
    return (recipe.head_epochs + recipe.epochs) * steps_per_epoch(recipe.dp_sample_rate)


@dataclass
class Accountant:
    """A hospital's privacy ledger: the ``(noise multiplier, sample rate, steps)`` of every DP-SGD phase so far,
    and epsilon from Opacus's RDP accountant."""

    history: list[tuple[float, float, int]] = field(default_factory=list)

    def _opacus(self, extra: tuple[float, float, int] | None = None) -> Any:
        from opacus.accountants import RDPAccountant

        accountant = RDPAccountant()
        accountant.history = [*self.history, *([extra] if extra else [])]
        return accountant

    def step(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Record ``steps`` DP-SGD steps (merged with the last entry when the parameters are the same)."""
        if steps <= 0:
            return
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, q, done = self.history[-1]
            self.history[-1] = (sigma, q, done + steps)
        else:
            self.history.append((float(noise_multiplier), float(sample_rate), int(steps)))

    @property
    def steps(self) -> int:
        """DP-SGD steps recorded so far."""
        return sum(s for _, _, s in self.history)

    def epsilon(self, delta: float) -> float:
        """Epsilon at ``delta`` of everything recorded (0 before any step)."""
        if not self.history:
            return 0.0
        return float(self._opacus().get_epsilon(delta))

    def epsilon_after(self, noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
        """Epsilon at ``delta`` if ``steps`` more steps were taken with these parameters (the budget check)."""
        return float(self._opacus((noise_multiplier, sample_rate, steps)).get_epsilon(delta))

    def to_json(self) -> dict[str, Any]:
        """The ledger as written to `ACCOUNTANT_FILE`: enough to recompute epsilon independently."""
        return {
            "accountant": ACCOUNTANT_NAME,
            "history": [{"noise_multiplier": s, "sample_rate": q, "steps": n} for s, q, n in self.history],
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Accountant:
        """A ledger read back; ``ValueError`` naming ``where`` for anything else."""
        try:
            history = [
                (float(e["noise_multiplier"]), float(e["sample_rate"]), int(e["steps"])) for e in data["history"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{where} is not a privacy ledger ({exc}); restore it from the hospital's backup"
            ) from None
        return cls(history)


def load_accountant(folder: Path) -> Accountant:
    """The hospital's ledger in ``folder`` (empty when none was written yet)."""
    path = folder / ACCOUNTANT_FILE
    if not path.is_file():
        return Accountant()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); restore it from the hospital's backup") from None
    return Accountant.from_json(data, str(path))
