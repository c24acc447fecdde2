"""The federation on one machine: where the server (``federation.server``) and the hospitals
(``federation.hospital``) meet. ``pools`` carries messages to hospitals in this process or in worker processes
(Flower's transports are in ``federation.flower``), and this package gives the entry points: ``Server``,
``local_sites``, ``resolve_config`` and ``load_run_config``.

``federation.launch.train`` runs a federation with the engine ``run.engine`` names (the in-process pools here, or
Flower's, which build on this package: it never imports ``federation.flower``). Each hospital keeps its folder (its
head, checkpoints and predictions) under ``<run>/hospitals/client_XX/`` on one machine, or on its own machine in a
deployment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from federation.config import RunConfig, load_config, parse_override, resolve_config
from federation.derived import derive_seed, initial_state, resolve_device
from federation.errors import FederationError
from federation.hospital.data import check_hospitals, read_manifest
from federation.hospital.handler import Site
from federation.runfiles import CONFIG_FILE, hospital_dir
from federation.runs import complete_checkpoints
from federation.server.loop import RunStopped, Server
from federation.summary_errors import read_summary_object

# Settings a resumed run may change: they do not alter the federation's maths.
RESUMABLE_KEYS = frozenset(
    {
        "run.rounds",
        "run.workers",
        "run.threads",
        "run.deterministic",
        "run.check_gpu_memory",
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
    """The hospitals of ``data.path`` (those ``strategy.clients`` chooses) as they are run on this machine
    (``hospital_sites``)."""
    return hospital_sites(Path(config.data.path), config.strategy.clients, run_dir)


def hospital_sites(dataset: Path, chosen: str | Sequence[int], run_dir: Path) -> list[Site]:
    """The hospitals of ``dataset`` that ``chosen`` names (``"all"``, or their indices) as they are run on this
    machine: each with its folder inside the run.

    Checks the dataset before anything starts (a missing tile or an empty client is one clear line).
    """
    rows = read_manifest(dataset)
    hospitals = check_hospitals(dataset, rows, None if isinstance(chosen, str) else chosen)
    return [Site(dataset, c, hospital_dir(run_dir, c)) for c in hospitals]


def _status(run_dir: Path) -> str | None:
    try:
        status = read_summary_object(run_dir).get("status")
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
    "RunStopped",
    "Server",
    "derive_seed",
    "initial_state",
    "load_run_config",
    "local_sites",
    "resolve_config",
    "resolve_device",
]
