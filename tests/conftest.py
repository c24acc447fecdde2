"""Fixtures shared by every test folder (plain helpers are in ``tests/support``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.scheduling import SERIAL_GROUP, by_work_unit, work_unit_of
from support.tiny_dataset import make_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dataset of ``support.tiny_dataset`` (three hospitals, one gray), made once per test module; a module
    that needs another dataset defines its own ``dataset``."""
    return make_dataset(tmp_path_factory.mktemp("tiny"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Units of work for pytest-xdist's workers: the serial tests on one worker (``support.scheduling``)."""
    return by_work_unit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """When the suite runs in parallel (a pytest-xdist worker), the serial tests first; a stable sort, so the order
    within each unit is unchanged."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: work_unit_of(item.nodeid) != SERIAL_GROUP)
