"""Who takes part in a run: the hospitals that answered the server's ``Hello`` (FedSAF paper 001, Algorithm 1,
Step 1), checked before round 1 and again on resume (docs/design.md, "Trust model"; docs/reliability.md).

A hospital whose reply is a ``Failure`` stops the start when the run wants it; one whose counts are not counts
(``federation.server.guard.hello_problem``) is left out, named, and the others go on. On resume the same hospitals
and the same classes must answer as the run recorded in ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.server.guard import hello_problem
from federation.wire.codec import Message
from federation.wire.contract import Failure, HelloReply


def roster(
    replies: Mapping[int, Message],
    chosen: str | Sequence[int],
    max_examples: int | None,
    run_id: str,
    warn: Callable[[str], None],
) -> tuple[tuple[int, ...], dict[int, HelloReply], dict[int, str]]:
    """The hospitals of the run (ascending), every usable ``HelloReply`` by hospital, and the hospitals left out
    with the reason (each also told to ``warn``). ``chosen``: ``strategy.clients`` (``"all"``, or the indices the
    run wants). ``FederationError`` (one line) when a wanted hospital failed or did not answer, or none is left."""
    failed = {c: r.reason for c, r in replies.items() if isinstance(r, Failure)}
    hellos = {c: r for c, r in replies.items() if isinstance(r, HelloReply)}
    # a Hello whose counts are not counts: that hospital is left out of the run, the others go on
    refused = {c: p for c in sorted(hellos) if (p := hello_problem(hellos[c], max_examples))}
    for c, problem in refused.items():
        del hellos[c]
        warn(f"hospital {c} is left out of run {run_id}: {problem}")
    wanted = sorted(hellos) + sorted(failed) if isinstance(chosen, str) else sorted(chosen)
    wanted = [c for c in wanted if c not in refused]
    problems = [f"hospital {c}: {failed[c]}" for c in wanted if c in failed]
    if problems:
        raise FederationError("; ".join(problems))
    absent = [c for c in wanted if c not in hellos]
    if absent:
        raise FederationError(f"strategy.clients names {absent}, but the hospitals that answered are {sorted(hellos)}")
    hospitals = tuple(sorted(wanted))
    if not hospitals and refused:
        reasons = "; ".join(f"hospital {c}: {r}" for c, r in refused.items())
        raise FederationError(f"no hospital is left to federate ({reasons})")
    if not hospitals:
        raise FederationError("no hospital answered: there is nobody to federate")
    return hospitals, hellos, refused


def check_same_hospitals(summary: Mapping[str, Any], run_dir: Path, hospitals: Sequence[int]) -> None:
    """On resume: the hospitals that answered are those the run recorded (``summary.json``'s ``clients``)."""
    if summary.get("clients") not in (None, list(hospitals)):
        raise FederationError(
            f"{run_dir} was run with hospitals {summary['clients']}, but {list(hospitals)} answered now: "
            "resume with the same hospitals, or start a new run"
        )


def check_same_classes(summary: Mapping[str, Any], run_dir: Path, classes: Sequence[str]) -> None:
    """On resume: the hospitals report the classes the run recorded (``summary.json``'s ``classes``)."""
    recorded = summary.get("classes")
    if recorded is not None and list(recorded) != list(classes):
        raise FederationError(
            f"{run_dir} was run with the classes {list(recorded)}, but the hospitals now report "
            f"{list(classes)}: resume with the same datasets, or start a new run"
        )
