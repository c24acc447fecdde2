"""How the deployment waits for something that has not come yet (a hospital's reply at the ServerApp, a task at
a hospital's executor): a short first wait, growing while nothing comes, so that what arrives is seen within a
fraction of a second and a long wait costs at most two requests a second. Flower 1.41's own loops wait a fixed
3 s (``Grid.send_and_receive``) or 1 s (its SuperExec) instead."""

from __future__ import annotations

from collections.abc import Iterator

FIRST_WAIT = 0.05  # seconds
LAST_WAIT = 0.5
GROWTH = 1.5


def waits() -> Iterator[float]:
    """``FIRST_WAIT``, then x ``GROWTH`` per wait, never above ``LAST_WAIT``; start a new one to start over."""
    wait = FIRST_WAIT
    while True:
        yield wait
        wait = min(wait * GROWTH, LAST_WAIT)
