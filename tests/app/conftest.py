"""Fixtures for the dashboard tests (builders in tests/support/dashboard.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.dashboard import Fixture, build


@pytest.fixture
def fixture_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fixture:
    """A data root with a prepared dataset, a finished run, a failed run and a 2x2 ablation grid."""
    fx = build(tmp_path / "data")
    monkeypatch.setenv("GASTRIC_FL_DATA", str(fx.root))
    return fx


@pytest.fixture
def empty_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data root with nothing in it yet."""
    root = tmp_path / "empty"
    monkeypatch.setenv("GASTRIC_FL_DATA", str(root))
    return root
