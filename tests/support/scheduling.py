"""How the suite is spread over pytest-xdist workers (scripts/test.sh runs it in two): tests that start Flower's
processes, or look at every process of the machine, run one after another on one worker, first; every other module
is one unit of work, so its module-scoped fixtures are built once.

A deployment test asserts that no Flower process is left on the machine, which another worker's deployment would
break, hence the one serial unit. They go first because together they take the longest.

pytest-xdist's ``loadgroup`` mode would express this with ``xdist_group`` marks, but pytest 9 ignores the node-id
suffix it relies on, so the suite schedules by its own key instead: `by_work_unit` is pytest-xdist's scheduling by
scope (``LoadScopeScheduling``: a scope's tests go to one worker, scopes in collection order) with `work_unit_of` as
the scope. It overrides ``LoadScopeScheduling._split_scope``, which pytest-xdist does not document; `by_work_unit`
refuses to run when that method is gone, and ``tests/test_scheduling.py`` feeds the real scheduler a collection and
checks where the serial tests go, so an upgrade that stops consulting the override fails the suite rather than
running two deployments at once.
"""

from __future__ import annotations

from typing import Any

import pytest

SERIAL = (
    "tests/federation/flower/",
    "tests/federation/test_privacy.py",
    "tests/app/dashboard/test_dashboard_jobs.py",
    "tests/infra/test_pids.py",
    "tests/infra/test_parent_death.py",
)
SERIAL_GROUP = "serial"


def work_unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to when the suite runs in parallel: ``serial`` for the `SERIAL` paths, else
    its module's path."""
    module = nodeid.split("::", 1)[0]
    return SERIAL_GROUP if module.startswith(SERIAL) else module


def by_work_unit(config: pytest.Config, log: Any = None) -> Any:
    """A pytest-xdist scheduler whose units of work are `work_unit_of` (module docstring)."""
    from xdist.scheduler import LoadScopeScheduling

    if not callable(getattr(LoadScopeScheduling, "_split_scope", None)):
        raise pytest.UsageError(
            "pytest-xdist's LoadScopeScheduling has no _split_scope any more: tests/support/scheduling.py must be "
            "updated to keep the deployment tests on one worker (or run the suite with -n 0)"
        )

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(nodeid)

    return ByWorkUnit(config, log)
