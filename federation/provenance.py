"""Which code trained a run: the git commit of the checkout, recorded in each run's ``summary.json``.

A published table (``gastric-fl ablate --publish``) names the commit every one of its runs was trained at, so a
reader knows which code to check out to get the same numbers.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

CODE_FOLDERS = ("app", "federation", "models", "pipeline", "inference", "infra")


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


def add_code_version(recorded: Sequence[str] | None, current: str) -> list[str]:
    """The code versions that trained a run, oldest first: ``current`` appended when a resume runs other code."""
    versions = list(recorded or [])
    if not versions or versions[-1] != current:
        versions.append(current)
    return versions


def describe_code_versions(trained_at: Mapping[str, Sequence[str]]) -> str:
    """One sentence naming the commit(s) the runs were trained at, e.g. for a table's ``COMMAND.md``.

    ``trained_at`` maps a description of a run's code versions to the runs trained with it.
    """
    if not trained_at:
        return "No finished run."
    if len(trained_at) == 1:
        (versions,) = trained_at
        return f"Every run was trained at {versions}."
    parts = [f"{versions}: {len(runs)} run(s) ({', '.join(runs)})" for versions, runs in sorted(trained_at.items())]
    return "Runs were trained at different commits: " + "; ".join(parts) + "."
