"""``train``: run (or resume) a federation with the engine ``run.engine`` names.

* ``local`` (default): the hospitals of ``data.path`` in this process, or in ``run.workers`` processes
  (`federation.engine`);
* ``flower-sim``: the same hospitals as Flower ClientApps in Flower's simulation runtime (one machine);
* ``flower``: hospitals deployed as SuperNodes of a SuperLink (``[flower]``; docs/deployment.md).

All three run the same round loop, strategies and client recipes (`federation.server.loop`). This module sits above
``federation.engine`` and ``federation.flower`` so that neither imports the other both ways (docs/design.md,
"Layout and layers"; ``tests/test_dependencies.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from federation.config import RunConfig
from federation.engine import Server, hospital_sites, resolve_config
from federation.engine.pools import InProcessPool, WorkerPool
from federation.server.pool import Pool
from infra.formats import manifest_sha256
from models import check_input_size


def train(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) a federation into ``run_dir`` with ``run.engine``; returns the final summary.

    ``run.audit = true`` describes every message that crosses the hospital boundary in ``messages.jsonl``.
    """
    config = resolve_config(config)
    if config.run.engine == "flower":
        from federation.flower.runner import run_with_flower

        return run_with_flower(config, run_dir, resume=resume, overwrite=overwrite, progress=progress)
    # Settings that cannot work are refused before a run directory exists, so a mistyped --data leaves nothing.
    check_input_size(config.model.name, config.data.input_size)
    sites = hospital_sites(Path(config.data.path), config.strategy.clients, run_dir)
    if config.run.engine == "flower-sim":
        from federation.flower.runner import run_with_flower

        return run_with_flower(config, run_dir, resume=resume, overwrite=overwrite, progress=progress, sites=sites)
    if config.run.workers > 0:
        from federation.hospital.gpu_memory import check_workers_fit

        check_workers_fit(config, [site.data_index for site in sites])
    server = Server(config, run_dir, progress=progress)
    server.dataset_sha256 = manifest_sha256(Path(config.data.path))  # recorded in summary.json, checked on resume

    def make_pool() -> Pool:
        if config.run.workers > 0:
            return WorkerPool(sites, config.run.workers, config.run.threads)
        return InProcessPool(sites)

    return server.run(make_pool, resume=resume, overwrite=overwrite)
