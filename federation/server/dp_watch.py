"""The server's check of the privacy figures the hospitals report: a DP hospital's epsilon and steps must grow.

Under differential privacy (`federation.hospital.privacy`) every accepted training reply carries the hospital's epsilon
so
far (``dp_epsilon``, from its own ledger with Opacus's RDP accountant) and the DP-SGD steps its ledger holds
(``dp_steps``). Each round of DP-SGD adds steps, and RDP composes additively (Mironov, 2017, Proposition 1), so both
must be strictly larger than in the hospital's previous accepted reply. A hospital whose ledger was reset
consistently (ledger and anchor both) reports its round-2 figures equal to round 1's; its own checks cannot see
that, the server, which holds both rounds, can. It names the hospital and the figures (a warning and
``aggregation.jsonl``'s ``dp_not_growing``); the update is still aggregated: its noise is what the recipe asked
for, only the hospital's account of its total privacy loss is wrong.

After a resume the figures come back from ``metrics.jsonl`` (`DpWatch.from_metrics`). Standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# a tolerance for epsilon's float rounding: an accountant's epsilon over more steps is larger by far more
EPSILON_RTOL = 1e-9


@dataclass
class DpWatch:
    """The last ``(epsilon, steps)`` each hospital reported in an accepted training reply."""

    last: dict[int, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, path: Path) -> DpWatch:
        """The figures of ``metrics.jsonl`` (a resumed run); a missing file or line without them adds nothing."""
        watch = cls()
        if not path.is_file():
            return watch
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(line, dict) and line.get("trained"):
                watch._note(line.get("client"), line.get("dp_epsilon"), line.get("dp_steps"))
        return watch

    def _note(self, hospital: Any, epsilon: Any, steps: Any) -> None:
        if isinstance(hospital, int) and _number(epsilon) and _number(steps):
            self.last[hospital] = (float(epsilon), float(steps))

    def check(self, server_round: int, metrics: Mapping[int, Mapping[str, Any]]) -> dict[str, str]:
        """For each hospital of ``metrics`` (its accepted training reply's metrics) whose epsilon or steps did not
        grow since its previous accepted reply: why, in one line (keyed by the hospital as a string); then the
        figures are remembered for the next round."""
        flags: dict[str, str] = {}
        for c in sorted(metrics):
            raw_epsilon: Any = metrics[c].get("dp_epsilon")
            raw_steps: Any = metrics[c].get("dp_steps")
            if not (_number(raw_epsilon) and _number(raw_steps)):
                continue
            epsilon, steps = float(raw_epsilon), float(raw_steps)
            before = self.last.get(c)
            if before is not None:
                grew = []
                if not steps > before[1]:
                    grew.append(f"steps {steps:g} after {before[1]:g}")
                if not epsilon > before[0] * (1.0 + EPSILON_RTOL):
                    grew.append(f"epsilon {epsilon:.4f} after {before[0]:.4f}")
                if grew:
                    flags[str(c)] = (
                        f"round {server_round}: hospital {c}'s DP ledger did not grow ({', '.join(grew)}): its "
                        "privacy ledger was reset or edited, so the epsilon it reports understates its privacy loss"
                    )
            self._note(c, epsilon, steps)
        return flags


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
