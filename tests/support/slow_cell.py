"""A stand-in for a grid cell's training, importable by a spawned worker process (the interruption tests of
`federation.ablation.cells`): it marks the run folder when it starts, then waits; Ctrl-C marks it interrupted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def slow_train(config: Any, run_dir: Path, **_: Any) -> dict[str, Any]:
    """Write ``started`` into ``run_dir``, then wait up to a minute; on Ctrl-C write ``interrupted`` and re-raise."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "started").write_text("1")
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        (run_dir / "interrupted").write_text("1")
        raise
    (run_dir / "finished").write_text("1")
    return {}
