"""Helpers shared by the pipeline tests."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by its path relative to ``root`` (forward slashes)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }
