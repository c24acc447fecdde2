"""The progress bar of a running federation: rounds done (``metrics.jsonl``), the time left (``summary.json``) and
where the current round stands (``progress.json``, written by the round loop: ``federation.progress``).

A round is laid out on the bar as the engine spends it on a typical run: training takes most of it, so the
hospitals that have trained fill its first 80 %, aggregation sits at 80 %, and evaluation fills the rest. The
bar only moves forward within a round; the text says what happens in words.
"""

from __future__ import annotations

from app.run_records import Progress, format_seconds
from federation.progress import RoundProgress

# Where each phase of a round starts on the bar and how much of it the phase covers.
PHASE_SPAN: dict[str, tuple[float, float]] = {
    "training": (0.0, 0.8),
    "aggregating": (0.8, 0.05),
    "evaluating": (0.85, 0.15),
}


def round_fraction(step: RoundProgress) -> float:
    """How far into its round ``step`` is, in [0, 1]."""
    start, span = PHASE_SPAN.get(step.phase, (0.0, 0.0))
    share = step.hospitals_done / step.hospitals_total if step.hospitals_total else 0.0
    return min(1.0, start + span * share)


def phase_text(step: RoundProgress) -> str:
    """The current step of a round in words: "training, 2 of 3 hospitals done"."""
    if step.phase == "aggregating":
        return "combining the hospitals' updates"
    verb = "training" if step.phase == "training" else "evaluating"
    return f"{verb}, {step.hospitals_done} of {step.hospitals_total} hospitals done"


def current_step(state: Progress, step: RoundProgress | None, running: bool) -> RoundProgress | None:
    """``step`` when it describes the round now in progress (the one after the rounds done), else ``None``."""
    if not running or step is None or step.round != state.rounds_done + 1:
        return None
    if state.rounds_total is not None and step.round > state.rounds_total:
        return None
    return step


def bar(state: Progress, step: RoundProgress | None, running: bool) -> tuple[float, str]:
    """The bar's fill in [0, 1] and its text: "Round 2 of 5 · round 3: training, 1 of 3 hospitals done · about
    1 min 35 s left" (without ``progress.json``: "Round 2 of 5 · about 1 min 35 s left")."""
    text = f"Round {state.rounds_done} of {state.rounds_total or '?'}"
    fraction = state.fraction
    now = current_step(state, step, running)
    if now is not None:
        text += f" · round {now.round}: {phase_text(now)}"
        if state.rounds_total:
            fraction = min(1.0, (state.rounds_done + round_fraction(now)) / state.rounds_total)
    if running and state.seconds_left is not None:
        text += f" · about {format_seconds(state.seconds_left)} left"
    return fraction, text
