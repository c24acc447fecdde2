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
