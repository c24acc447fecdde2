"""The federation engine: one round loop (``loop``), pools that carry messages to hospitals (``pools``; Flower's
in ``federation.flower``), one wire codec (``codec``) and the hospital side (``hospital``).

``train`` runs a federation with the engine ``run.engine`` names:

* ``local`` (default): the hospitals of ``data.path`` in this process, or in ``run.workers`` processes;
* ``flower-sim``: the same hospitals as Flower ClientApps in Flower's simulation runtime (one machine);
* ``flower``: hospitals deployed as SuperNodes of a SuperLink (``[flower]``; docs/deployment.md).

All three run the same strategies and client recipes; each hospital keeps its folder (its head, checkpoints and
predictions) under ``<run>/hospitals/client_XX/`` on one machine, or on its own machine in a deployment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from federation.config import RunConfig, load_config, parse_override
from federation.data import check_clients, read_manifest
from federation.engine.common import derive_seed, initial_state, resolve_config, resolve_device
from federation.engine.hospital import Site, hospital_folder, manifest_sha256
from federation.engine.loop import Engine, RunStopped
from federation.engine.pools import InProcessPool, Pool, WorkerPool
from federation.errors import FederationError
from federation.runs import CONFIG_FILE, SUMMARY_FILE, complete_checkpoints, read_json
from models import check_input_size

# Settings a resumed run may change: they do not alter the federation's maths.
RESUMABLE_KEYS = frozenset(
    {
        "run.rounds",
        "run.workers",
        "run.threads",
        "run.keep_checkpoints",
        "run.device",
        "run.engine",
        "run.audit",
        "flower.superlink",
        "flower.root_certificates",
        "flower.connect_timeout",
        "flower.round_timeout",
    }
)


def local_sites(config: RunConfig, run_dir: Path) -> list[Site]:
    """The hospitals of ``data.path`` as they are run on this machine: each with its folder inside the run.

    Checks the dataset before anything starts (a missing tile or an empty client is one clear line).
    """
    dataset = Path(config.data.path)
    rows = read_manifest(dataset)
    chosen = config.strategy.clients
    clients = check_clients(dataset, rows, None if isinstance(chosen, str) else chosen)
    return [Site(dataset, c, hospital_folder(run_dir, c)) for c in clients]


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
    sites = local_sites(config, run_dir)
    if config.run.engine == "flower-sim":
        from federation.flower.runner import run_with_flower

        return run_with_flower(config, run_dir, resume=resume, overwrite=overwrite, progress=progress, sites=sites)
    engine = Engine(config, run_dir, progress=progress)
    engine.dataset_sha256 = manifest_sha256(Path(config.data.path))  # recorded in summary.json, checked on resume

    def make_pool() -> Pool:
        if config.run.workers > 0:
            return WorkerPool(sites, config.run.workers, config.run.threads)
        return InProcessPool(sites)

    return engine.run(make_pool, resume=resume, overwrite=overwrite)


def _status(run_dir: Path) -> str | None:
    try:
        status = read_json(run_dir / SUMMARY_FILE).get("status")
    except FederationError:
        return None
    return status if isinstance(status, str) else None


def load_run_config(run_dir: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The saved configuration of ``run_dir`` with the (few) overrides a resume may change.

    A run that *failed* before its first complete checkpoint has trained nothing that a change could contradict:
    it restarts at round 1, so any setting may change (how a configuration error found inside the run, such as
    FedAMP's ``amp.alpha_k`` against the number of hospitals, is corrected).
    """
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise FederationError(
            f"{run_dir} has no {CONFIG_FILE}: --resume needs a run directory made by gastric-fl train"
        )
    if not complete_checkpoints(run_dir) and _status(run_dir) == "failed":
        return load_config(path, overrides)
    for text in overrides:
        section, key, _ = parse_override(text)
        if f"{section}.{key}" not in RESUMABLE_KEYS:
            raise FederationError(
                f"--set {text}: a resumed run keeps its configuration; "
                f"only {', '.join(sorted(RESUMABLE_KEYS))} may change"
            )
    return load_config(path, overrides)


__all__ = [
    "RESUMABLE_KEYS",
    "Engine",
    "RunStopped",
    "derive_seed",
    "initial_state",
    "load_run_config",
    "local_sites",
    "resolve_config",
    "resolve_device",
    "train",
]
