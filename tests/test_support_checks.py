"""``support.checks.every``: the ``all()`` of the tests, which fails where there is nothing to check."""

from __future__ import annotations

from support.checks import every


def test_every_is_false_on_nothing_and_on_one_false_value() -> None:
    assert all([])  # the trap it replaces
    assert not every([])
    assert not every(x > 0 for x in [])
    assert not every(x > 0 for x in [3, 0, 2])
    assert not every(x > 0 for x in [1, 2] if x > 5)  # a filter that leaves nothing


def test_every_is_true_when_each_of_some_values_holds() -> None:
    assert every([1])
    assert every(x > 0 for x in [3, 1, 2])
    assert every(x > 0 for x in [-1, 2] if x > 0)


def test_every_stops_at_the_first_false_value() -> None:
    seen: list[int] = []

    def positive(x: int) -> bool:
        seen.append(x)
        return x > 0

    assert not every(positive(x) for x in [1, -1, 2])
    assert seen == [1, -1]
