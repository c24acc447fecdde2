"""What the benchmark scripts' reports share: the command that ran them, the machine line, writing the file."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def command_line(script: str) -> str:
    """``benchmarks/<script>`` with this process's arguments, as typed from the repository root."""
    return " ".join([".venv/bin/python", f"benchmarks/{script}", *sys.argv[1:]])


def machine() -> str:
    """``Machine: <architecture>, <n> CPU cores visible (load average ...)``, the start of a report's machine line.

    The load average (1 / 5 / 15 min, when the report is written) says whether other work shared the cores.
    """
    load = os.getloadavg()
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores visible "
        f"(load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} when written)"
    )


def write_result(path: Path, text: str) -> None:
    """Write a report to ``path``, creating its folder when needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
