"""The suite's spreading over pytest-xdist workers (``support.scheduling``), fed to pytest-xdist's real scheduler:
every serial test goes to one worker as one unit, before anything else, and the other modules to the other worker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from support.checks import every
from support.scheduling import SERIAL, SERIAL_GROUP, by_work_unit, work_unit_of

ROOT = Path(__file__).resolve().parents[1]


class FakeWorker:
    """What the scheduler calls on a worker: it records the test indexes it is sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))

    def shutdown(self) -> None:
        self.shutting_down = True


def _config(workers: int) -> SimpleNamespace:
    return SimpleNamespace(
        getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None,
        option=SimpleNamespace(loadscopereorder=False, maxschedchunk=None),
    )


COLLECTION = [
    "tests/federation/flower/test_deploy.py::test_a",
    "tests/federation/flower/test_deploy.py::test_b",
    "tests/federation/flower/test_hostile.py::test_c",
    "tests/federation/test_privacy.py::test_d",
    "tests/infra/test_pids.py::test_e",
    "tests/federation/test_report.py::test_f",
    "tests/federation/test_report.py::test_g",
    "tests/pipeline/test_prepare.py::test_h",
    "tests/models/test_split.py::test_i",
    "tests/models/test_split.py::test_j",
]


def test_the_serial_tests_go_to_one_worker_as_one_unit_and_the_rest_elsewhere() -> None:
    scheduler = by_work_unit(_config(2))  # type: ignore[arg-type]
    workers = [FakeWorker("gw0"), FakeWorker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, COLLECTION)
    scheduler.schedule()
    serial = {i for i, nodeid in enumerate(COLLECTION) if nodeid.startswith(SERIAL)}
    assert len(serial) == 5
    first, second = workers
    # the first worker's first batch is exactly the serial unit (the first unit in collection order)
    assert first.sent[0] == sorted(serial)
    given_first = {i for batch in first.sent for i in batch}
    given_second = {i for batch in second.sent for i in batch}
    assert serial <= given_first
    assert not serial & given_second
    assert given_second  # the other worker has work meanwhile
    # no module is split between the workers (a module not yet sent waits whole in the queue)
    for module in {work_unit_of(n) for n in COLLECTION}:
        members = {i for i, n in enumerate(COLLECTION) if work_unit_of(n) == module}
        assert not (members & given_first and members & given_second), module
    assert set(scheduler.workqueue) == {work_unit_of(COLLECTION[i]) for i in range(len(COLLECTION))} - {
        work_unit_of(COLLECTION[i]) for i in given_first | given_second
    }


def test_a_scheduler_without_the_method_it_overrides_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from xdist.scheduler import LoadScopeScheduling

    monkeypatch.delattr(LoadScopeScheduling, "_split_scope")
    with pytest.raises(pytest.UsageError, match="_split_scope"):
        by_work_unit(_config(2))  # type: ignore[arg-type]


def test_every_serial_path_exists_and_is_the_one_serial_unit() -> None:
    assert every((ROOT / path).exists() for path in SERIAL), [p for p in SERIAL if not (ROOT / p).exists()]
    assert work_unit_of("tests/federation/flower/test_x.py::t") == SERIAL_GROUP
    assert work_unit_of("tests/federation/test_privacy.py::t[1]") == SERIAL_GROUP
    assert work_unit_of("tests/federation/test_report.py::t") == "tests/federation/test_report.py"
