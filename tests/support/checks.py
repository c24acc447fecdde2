"""Checks that cannot pass on nothing. ``all()`` is True for an empty iterable, so ``assert all(...)`` over records
that were never written, or keys that were never sent, passes; ``every`` fails there instead."""

from __future__ import annotations

from collections.abc import Iterable


def every(checks: Iterable[object]) -> bool:
    """True when ``checks`` yields at least one value and each value is true; False when it yields none (where
    ``all`` gives True) or when one is false. Written like ``all``: ``assert every(f(x) for x in xs)``."""
    seen = False
    for check in checks:
        if not check:
            return False
        seen = True
    return seen
