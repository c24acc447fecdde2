"""``gastric-fl federation demo``: a whole deployment on 127.0.0.1, one run, then everything torn down.

What a group of hospitals runs, all on this machine: a kit (``federation init``: CA, server certificate, one key
pair per hospital), the SuperLink with TLS and SuperNode authentication, every hospital's public key registered,
one SuperNode per hospital of the prepared dataset (``federation hospital``), then ``flwr run`` of the gastric-fl
app bundle (``train --engine flower``). Each hospital's folder is ``<run>/hospitals/client_XX/`` as in the local
engine, so ``report`` and the dashboard read the run the same way; the kit, the logs and the SuperLink's database
live in a temporary folder (``--keep``: kept beside the run as ``<run>.deployment/``). Every process is stopped by
its process group when the demo ends, fails or is interrupted.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from federation.config import RunConfig
from federation.engine import local_sites, resolve_config
from federation.flower.kit import hospital_name, init_kit
from federation.flower.local_deployment import LocalDeployment, NodeSpec
from federation.flower.runner import run_config, submit_and_follow, time_limit
from federation.hospital.data import extract_hospital
from federation.hospital.policy import load_policy
from federation.runfiles import hospital_dir
from models import check_input_size


def run_demo(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    keep: bool = False,
    during: Callable[[LocalDeployment], Any] | None = None,
    policy: Path | None = None,
    finished: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Deploy on loopback, run ``config`` into ``run_dir`` and tear down; returns the run's summary plus the
    deployment's start-up ``timings`` (seconds). ``during`` is called with the live deployment right after the run
    is submitted (the tests use it to kill a SuperNode or stop the SuperLink mid-run). ``policy``: every hospital's
    policy file (``federation.hospital.policy``; default: the safe defaults). ``finished`` is called once a run has
    finished, while each hospital's own dataset (its part of the data, copied into the work folder) is still there:
    the command scores each hospital's held-out slides with them."""
    config = resolve_config(config)
    if policy is not None:
        load_policy(policy)  # a bad file is one line before anything starts
    check_input_size(config.model.name, config.data.input_size)
    sites = local_sites(config, run_dir)
    names = [hospital_name(s.hospital) for s in sites]
    work = run_dir.parent / f"{run_dir.name}.deployment" if keep else Path(tempfile.mkdtemp(prefix="gastric-fl-demo-"))
    try:
        kit = init_kit(work / "kit", names, host="127.0.0.1", overwrite=True)
        shutil.rmtree(work / "data", ignore_errors=True)  # this command's own copies of an earlier demo
        nodes = [
            NodeSpec(
                hospital_name(s.hospital),
                {
                    "partition-id": i,
                    "client": s.hospital,
                    "data-client": 0,
                    # each hospital holds only its own slides: its part of the dataset, as a dataset of its own
                    "data-path": str(
                        extract_hospital(s.dataset, s.hospital, work / "data" / hospital_name(s.hospital))
                    ),
                    "hospital-dir": str(hospital_dir(run_dir, s.hospital).resolve()),
                    "per-run": False,
                    **({"policy": str(Path(policy).resolve())} if policy is not None else {}),
                },
            )
            for i, s in enumerate(sites)
        ]
        began = time.monotonic()
        with LocalDeployment(kit, nodes, workdir=work / "deployment") as deployment:
            startup = time.monotonic() - began
            values = run_config(config, run_dir, hospitals=len(sites), resume=resume, overwrite=overwrite, sites=sites)
            if during is not None:
                threading.Thread(target=during, args=(deployment,), daemon=True).start()
            rounds, limit = config.run.rounds, time_limit(config.flower, config.run.rounds)
            summary = submit_and_follow(
                deployment.cli, run_dir, values, work, rounds=rounds, limit=limit, progress=progress
            )
            timings = {**deployment.timings, "startup": startup}
        summary["deployment_timings"] = timings
        if finished is not None and summary.get("status") == "finished":
            finished()
        return summary
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
