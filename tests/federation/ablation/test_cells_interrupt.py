"""Ctrl-C, once or twice, on a grid running in worker processes (``ablate --workers N``; issue 48, part 5): the cells
training are interrupted, a cell not started never starts, no worker prints a traceback, and a second Ctrl-C while
the grid waits for its cells ends it at once instead of hanging. The grid runs in a process group of its own, which
the test signals as a terminal's Ctrl-C would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# The grid starts with Python's own Ctrl-C handler, as a command in a terminal's foreground does: a process started
# in the background of a shell (`cmd &`, nohup) inherits SIGINT ignored, and then no Ctrl-C could reach it.
GRID = """
import signal
import sys
from concurrent.futures import wait
from pathlib import Path

from federation.ablation.cells import process_cells
from support.slow_cell import slow_train

signal.signal(signal.SIGINT, signal.default_int_handler)
out = Path(sys.argv[1])
try:
    with process_cells(2, on_gpu=False) as (submit, _):
        futures = [submit(slow_train, None, out / f"cell{i}", False) for i in range(3)]
        wait(futures)
except KeyboardInterrupt:
    print("grid stopped", file=sys.stderr)
    sys.exit(130)
"""


def _grid(tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.Popen(
        [sys.executable, "-c", GRID, str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_started(tmp_path: Path, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"cell{i}" / "started").exists() for i in (0, 1)):
        if time.monotonic() > deadline or process.poll() is not None:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail("the two workers never started their cells")
        time.sleep(0.1)


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_interrupts_the_cells_training_and_starts_no_other(tmp_path: Path, presses: int) -> None:
    process = _grid(tmp_path)
    _wait_started(tmp_path, process)
    for _ in range(presses):
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.3)
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"the grid still ran 30 s after {presses} Ctrl-C")
    assert process.returncode == 130
    assert err.strip().splitlines() == ["grid stopped"]  # no worker's traceback
    assert (tmp_path / "cell0" / "interrupted").exists()
    assert (tmp_path / "cell1" / "interrupted").exists()
    assert not (tmp_path / "cell2").exists()  # the third cell was waiting for a worker: never started
