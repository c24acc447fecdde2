"""Where the dashboard finds its data: the ``--data`` root with ``raw/``, ``prepared/``, ``runs/`` and
``ablations/`` inside.

``gastric-fl dashboard --data DIR`` hands the root to the Streamlit process through ``GASTRIC_FL_DATA``;
without it the dashboard uses ``data/`` in the current directory, the CLI's default home (data/README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "GASTRIC_FL_DATA"
DEFAULT_DATA = Path("data")


def data_root() -> Path:
    """The data root the dashboard was started with (absolute, so background jobs agree on it)."""
    return Path(os.environ.get(DATA_ENV) or DEFAULT_DATA).expanduser().resolve()


def prepared_root(root: Path) -> Path:
    """Folder holding one sub-folder per prepared dataset."""
    return root / "prepared"


def runs_root(root: Path) -> Path:
    """Folder holding one sub-folder per run (or per ablation grid)."""
    return root / "runs"


def ablations_root(root: Path) -> Path:
    """Folder holding one sub-folder per ablation grid (``gastric-fl ablate --out``)."""
    return root / "ablations"


def raw_root(root: Path) -> Path:
    """Folder holding the raw slides (never modified)."""
    return root / "raw"


def jobs_root(root: Path) -> Path:
    """Dashboard bookkeeping for background jobs (process ids, logs): kept out of the documented run folders."""
    return root / ".dashboard" / "jobs"
