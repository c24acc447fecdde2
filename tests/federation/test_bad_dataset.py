"""A run whose dataset cannot be read is refused before its run directory exists (nothing left behind)."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.config import load_config
from federation.errors import FederationError
from federation.launch import train


def test_missing_manifest_is_refused_before_the_run_directory_is_created(tmp_path: Path) -> None:
    config = load_config(None, data=tmp_path / "not-prepared")
    run_dir = tmp_path / "runs" / "r1"
    with pytest.raises(FederationError, match=r"manifest\.csv not found"):
        train(config, run_dir, progress=False)
    assert not run_dir.exists()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
