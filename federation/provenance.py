"""Which code trained a run, and on which machine: the git commit of the checkout and a description of the machine,
recorded in each run's ``summary.json`` (``code_versions``, ``machines``).

A published table (``gastric-fl ablate --publish``) names the commit every one of its runs was trained at and the
machine it was trained on, so a reader knows which code to check out to get the same numbers, and whether a
difference between two runs of the same seed can come from two machines (another CPU or torch build changes a
run's figures slightly; each machine repeats its own runs exactly).
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

CODE_FOLDERS = ("app", "federation", "models", "pipeline", "inference", "infra")
NOT_RECORDED = "a machine not recorded"  # the machines of a run trained before runs recorded them


def code_version() -> str:
    """The git commit of the working folder's checkout (the code that ran), ``+ changes`` when its code differs.

    ``unknown`` outside a git checkout (e.g. an installed package).
    """

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=30, check=False)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return "unknown"
        changed = git("diff", "--quiet", "HEAD", "--", *CODE_FOLDERS)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + (" + changes" if changed.returncode != 0 else "")


def _cpu_model() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown CPU"


def machine(device: str) -> str:
    """This machine as a run's ``summary.json`` names it: CPU model and cores, the device that trains (a GPU by its
    name), torch and Python, e.g. ``AMD EPYC 7B13, 2 cores; device cpu; torch 2.11.0; Python 3.11.7``. No host name
    or address: a summary may be published."""
    import torch

    shown = device
    if device.startswith("cuda") and torch.cuda.is_available():
        shown = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return (
        f"{_cpu_model()}, {os.cpu_count()} cores; device {shown}; torch {torch.__version__}; "
        f"Python {platform.python_version()}"
    )


def add_distinct(recorded: Sequence[str] | None, current: str) -> list[str]:
    """What trained a run (its code versions, its machines), oldest first: ``current`` appended when a resume runs
    on other code or another machine."""
    values = list(recorded or [])
    if not values or values[-1] != current:
        values.append(current)
    return values


def describe_trained(groups: Mapping[str, Sequence[str]], preposition: str, plural: str) -> str:
    """One sentence naming what the runs were trained ``preposition`` ("at" commits, "on" machines), e.g. for a
    table's ``COMMAND.md``. ``groups`` maps a description (one run's code versions, or machines) to its runs."""
    if not groups:
        return "No finished run."
    if len(groups) == 1:
        (what,) = groups
        return f"Every run was trained {preposition} {what}."
    parts = [f"{what}: {len(runs)} run(s) ({', '.join(runs)})" for what, runs in sorted(groups.items())]
    return f"Runs were trained {preposition} different {plural}: " + "; ".join(parts) + "."


def describe_code_versions(trained_at: Mapping[str, Sequence[str]]) -> str:
    """`describe_trained` for commits: ``trained_at`` maps a description of a run's code versions to its runs."""
    return describe_trained(trained_at, "at", "commits")


def describe_machines(trained_on: Mapping[str, Sequence[str]]) -> str:
    """`describe_trained` for machines (``summary.json``'s ``machines``); nothing when no run recorded one (runs
    trained before runs recorded their machine)."""
    if set(trained_on) <= {NOT_RECORDED}:
        return ""
    return describe_trained(trained_on, "on", "machines")
