"""Fixtures shared by every test folder (plain helpers are in ``tests/support``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_dataset import make_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dataset of ``support.tiny_dataset`` (three hospitals, one gray), made once per test module; a module
    that needs another dataset defines its own ``dataset``."""
    return make_dataset(tmp_path_factory.mktemp("tiny"))


# Tests that start Flower's processes, or look at every process of the machine, run one after another on one worker
# when the suite runs in parallel (scripts/test.sh: pytest-xdist): a deployment test asserts that no Flower process
# is left on the machine, which another worker's deployment would break. They go first, because together they take
# the longest; every other module is one unit of work, so its module-scoped fixtures are built once.
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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scheduling by scope (LoadScopeScheduling: a scope's tests run on one worker, scopes in
    collection order), with `work_unit_of` as the scope."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit_of(nodeid)

    return ByWorkUnit(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """When the suite runs in parallel (a pytest-xdist worker), the serial tests first; a stable sort, so the order
    within each unit is unchanged."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: work_unit_of(item.nodeid) != SERIAL_GROUP)
