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
2017; the subsampled Gaussian of Mironov, Talwar and Zhang 2019), never hand-written. Each hospital's ledger, one
`LedgerEntry` per DP round as trained (round, unit, noise multiplier, sample rate, clip norm, tiles per unit, delta,
steps), is kept in its own folder (`ACCOUNTANT_FILE`), anchored in its ``hospital.json`` (`Accountant.anchor`) so
that a ledger removed, reset or edited is refused instead of counted again from zero, and survives resume; epsilon at
``privacy.delta`` after every round is what the hospital reports and records. What the hospital accepts (the unit,
bounds on sigma, q, C, tiles per unit and steps) is its policy's (`federation.hospital.policy.check_privacy`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from federation.config import DP_UNITS
from federation.runfiles import ACCOUNTANT_FILE as ACCOUNTANT_FILE  # named with the run's other files

if TYPE_CHECKING:
    from federation.wire.contract import Recipe

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


@dataclass(frozen=True)
class LedgerEntry:
    """One training round's DP-SGD at a hospital, as trained: the round, the unit protected and every parameter the
    guarantee depends on (noise multiplier, sample rate, steps, delta) or that bounds a unit's influence (clip norm,
    tiles per unit)."""

    round: int
    noise_multiplier: float
    sample_rate: float
    steps: int
    unit: str
    tiles_per_unit: int
    max_grad_norm: float
    delta: float

    @classmethod
    def of_round(cls, server_round: int, recipe: Recipe, steps: int) -> LedgerEntry:
        """Round ``server_round``'s entry: ``recipe``'s DP-SGD, trained in ``steps`` steps."""
        return cls(
            round=server_round,
            noise_multiplier=recipe.dp_noise_multiplier,
            sample_rate=recipe.dp_sample_rate,
            steps=steps,
            unit=recipe.dp_unit,
            tiles_per_unit=recipe.dp_tiles_per_unit,
            max_grad_norm=recipe.dp_max_grad_norm,
            delta=recipe.dp_delta,
        )

    def problem(self) -> str | None:
        """Why this entry cannot be a true record (a negative count, an impossible rate), or ``None``."""
        checks = [
            (self.round >= 1, f"round {self.round}"),
            (
                math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0,
                f"noise multiplier {self.noise_multiplier}",
            ),
            (0.0 < self.sample_rate <= 1.0, f"sample rate {self.sample_rate}"),
            (self.steps >= 1, f"steps {self.steps}"),
            (self.unit in DP_UNITS, f"unit {self.unit!r}"),
            (self.tiles_per_unit >= 1, f"tiles per unit {self.tiles_per_unit}"),
            (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0, f"clip norm {self.max_grad_norm}"),
            (0.0 < self.delta < 1.0, f"delta {self.delta}"),
        ]
        bad = [what for ok, what in checks if not ok]
        return ", ".join(bad) if bad else None


def merged_history(entries: Sequence[LedgerEntry]) -> list[tuple[float, float, int]]:
    """The ``(noise multiplier, sample rate, steps)`` history Opacus's accountant takes, consecutive entries with the
    same parameters merged (the same epsilon as unmerged: RDP composes additively)."""
    history: list[tuple[float, float, int]] = []
    for e in entries:
        if history and history[-1][:2] == (e.noise_multiplier, e.sample_rate):
            sigma, q, done = history[-1]
            history[-1] = (sigma, q, done + e.steps)
        else:
            history.append((float(e.noise_multiplier), float(e.sample_rate), int(e.steps)))
    return history


def rdp_epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """Epsilon at ``delta`` of a ``(noise multiplier, sample rate, steps)`` history, from Opacus's RDP accountant
    (``opacus.accountants.RDPAccountant``; Mironov 2017, Mironov, Talwar and Zhang 2019); 0 for no step."""
    if not history:
        return 0.0
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = list(history)
    return float(accountant.get_epsilon(delta))


def _digest(entries: Sequence[LedgerEntry]) -> str:
    text = json.dumps([dataclasses.asdict(e) for e in entries], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Accountant:
    """A hospital's privacy ledger: one `LedgerEntry` per DP-SGD round trained, and epsilon from Opacus's RDP
    accountant over all of them.

    The ledger is anchored (``anchor``: its entry count and the sha256 of those entries) in the hospital's
    ``hospital.json`` each time it is written, so that a ledger deleted, reset or edited between rounds is refused
    (`check_anchor`) instead of counting the budget from zero again. Entries added after the anchor (a process
    stopped between writing the ledger and its anchor) are accepted, as they can only raise epsilon, unless one
    switches the unit the anchored entries protect (slide or tile).
    """

    entries: list[LedgerEntry] = field(default_factory=list)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """The accountant's ``(noise multiplier, sample rate, steps)`` history (`merged_history`)."""
        return merged_history(self.entries)

    def step(self, entry: LedgerEntry) -> None:
        """Record one round's DP-SGD (nothing when it took no step)."""
        if entry.steps <= 0:
            return
        problem = entry.problem()
        if problem:
            raise ValueError(f"a ledger entry cannot hold {problem}")
        self.entries.append(entry)

    @property
    def steps(self) -> int:
        """DP-SGD steps recorded so far."""
        return sum(e.steps for e in self.entries)

    def epsilon(self, delta: float) -> float:
        """Epsilon at ``delta`` of everything recorded (0 before any step)."""
        return rdp_epsilon(self.history, delta)

    def epsilon_after(self, noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
        """Epsilon at ``delta`` if ``steps`` more steps were taken with these parameters (the budget check)."""
        return rdp_epsilon([*self.history, (noise_multiplier, sample_rate, steps)], delta)

    def anchor(self) -> dict[str, Any]:
        """What the hospital keeps of this ledger elsewhere (``hospital.json``): its entries, steps and sha256."""
        return {"entries": len(self.entries), "steps": self.steps, "sha256": _digest(self.entries)}

    def check_anchor(self, anchor: Any, where: str) -> None:
        """``ValueError`` naming ``where`` unless this ledger begins with the entries ``anchor`` was taken of."""
        try:
            count, digest = int(anchor["entries"]), str(anchor["sha256"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"the record of {where} in hospital.json is damaged; restore both from the hospital's backup"
            ) from None
        if len(self.entries) < count or _digest(self.entries[:count]) != digest:
            raise ValueError(
                f"{where} does not hold the {count} entries recorded in hospital.json (it was removed, reset or "
                "edited); the budget is never counted again from zero: restore it from the hospital's backup"
            )
        # an entry beyond the anchor can only raise epsilon, unless it protects another unit: then the ledger would
        # describe a different guarantee (a tile, not a slide) on the word of an entry nothing vouches for
        anchored = {e.unit for e in self.entries[:count]}
        for i, entry in enumerate(self.entries[count:], count + 1):
            if anchored and entry.unit not in anchored:
                raise ValueError(
                    f"{where} entry {i}, beyond the {count} recorded in hospital.json, protects a {entry.unit} where "
                    f"the recorded ones protect a {'/'.join(sorted(anchored))}: restore the ledger from the "
                    "hospital's backup"
                )

    def summary(self) -> dict[str, Any]:
        """What was trained, from the entries: each parameter's value, or the sorted list of its values where rounds
        differ (for the model card)."""
        out: dict[str, Any] = {}
        for name in ("unit", "noise_multiplier", "sample_rate", "max_grad_norm", "tiles_per_unit", "delta"):
            values = sorted({getattr(e, name) for e in self.entries})
            out[name] = values[0] if len(values) == 1 else values
        return out

    def to_json(self) -> dict[str, Any]:
        """The ledger as written to `ACCOUNTANT_FILE`: enough to recompute epsilon independently."""
        return {"accountant": ACCOUNTANT_NAME, "entries": [dataclasses.asdict(e) for e in self.entries]}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Accountant:
        """A ledger read back; ``ValueError`` naming ``where`` for anything else, or for an entry no training could
        have written (a negative count, an impossible rate)."""
        try:
            entries = [
                LedgerEntry(
                    round=_whole(e["round"]),
                    noise_multiplier=float(e["noise_multiplier"]),
                    sample_rate=float(e["sample_rate"]),
                    steps=_whole(e["steps"]),
                    unit=str(e["unit"]),
                    tiles_per_unit=_whole(e["tiles_per_unit"]),
                    max_grad_norm=float(e["max_grad_norm"]),
                    delta=float(e["delta"]),
                )
                for e in data["entries"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{where} is not a privacy ledger ({exc}); restore it from the hospital's backup"
            ) from None
        for i, entry in enumerate(entries, 1):
            problem = entry.problem()
            if problem:
                raise ValueError(
                    f"{where} entry {i} holds {problem}, which no training writes; restore it from the "
                    "hospital's backup"
                )
        return cls(entries)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    return value


def load_accountant(folder: Path) -> Accountant | None:
    """The hospital's ledger in ``folder``; ``None`` when there is no ledger file."""
    path = folder / ACCOUNTANT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); restore it from the hospital's backup") from None
    return Accountant.from_json(data, str(path))
