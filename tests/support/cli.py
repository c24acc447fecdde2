"""Run ``gastric-fl`` in-process as a user does (``app.cli.main``), for the tests of the commands."""

from __future__ import annotations

import sys

import pytest

from app.cli import main


def run_cli(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """``gastric-fl ARGS``; its exit code (0 when it exits without one)."""
    monkeypatch.setattr(sys, "argv", ["gastric-fl", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    code = exit_info.value.code
    return int(code) if isinstance(code, int) else 0
