"""``gastric-fl train --engine flower-sim | flower``: submit the run to a SuperLink with ``flwr run`` and follow it.

The same Flower app bundle (``federation/flower/fab``: ``federation.flower.apps.server_app`` and
``federation.flower.hospital_app.client_app``)
runs in both engines; only where the SuperLink and the hospitals are differs:

* ``flower-sim``: a SuperLink in simulation mode on 127.0.0.1 (plain HTTP, started and stopped here by its process
  group), whose simulation runtime runs one virtual SuperNode per hospital of ``data.path`` (Ray actors). Each
  hospital's folder is ``<run>/hospitals/client_XX/`` as in the local engine.
* ``flower``: the federation's SuperLink (``flower.superlink``, TLS verified with ``flower.root_certificates``)
  and the hospitals' SuperNodes, already running (``gastric-fl federation server`` / ``hospital``).

The ``ServerApp`` writes the server's run directory where ``--out`` says, on the SuperLink's machine; when that is
this machine (always for ``flower-sim`` and ``federation demo``), ``report``, ``ablate`` and the dashboard read it as
they read a local run. Progress is read from the run's ``summary.json``; Ctrl-C stops the Flower run (``flwr stop``).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from federation.config import FlowerSection, RunConfig, config_to_toml
from federation.errors import FederationError
from federation.flower.environment import ConfigValue
from federation.flower.flwr_cli import COMPLETED, FINISHED, FlwrCli
from federation.flower.operator import operator_problem
from federation.flower.superlink import SuperLink
from federation.hospital.handler import Site
from federation.run_reader import ENDED, RecordError, read_summary
from federation.runfiles import HOSPITALS_DIR, SUMMARY_FILE
from federation.runs import now_iso, write_json
from federation.server.loop import RunStopped
from federation.summary_errors import read_summary_object
from infra.formats import manifest_sha256

FAB_DIR = Path(__file__).resolve().parent / "fab"


def run_config(
    config: RunConfig, run_dir: Path, *, hospitals: int, resume: bool, overwrite: bool, sites: Sequence[Site] = ()
) -> dict[str, ConfigValue]:
    """The ``[tool.flwr.app.config]`` values of one run (``federation/flower/fab/pyproject.toml``)."""
    values: dict[str, ConfigValue] = {
        "config-toml": config_to_toml(config),
        "run-dir": str(run_dir.resolve()),
        "resume": resume,
        "overwrite": overwrite,
        "hospitals": hospitals,
    }
    if sites:
        values["dataset-sha256"] = manifest_sha256(Path(sites[0].dataset))
    if sites and config.run.engine == "flower-sim":
        values["sim-data-path"] = str(Path(sites[0].dataset).resolve())
        values["sim-clients"] = ",".join(str(s.hospital) for s in sites)
        values["sim-hospitals-dir"] = str((run_dir / HOSPITALS_DIR).resolve())
    return values


def _summary(run_dir: Path) -> dict[str, Any]:
    """The run's ``summary.json`` as far as it can be read now: empty while it is missing or unusable (it is read
    again at the next look)."""
    try:
        return dict(read_summary(run_dir).data)
    except (RecordError, OSError):  # OSError: the run directory itself cannot be looked into
        return {}


def _rounds_done(summary: dict[str, Any]) -> int:
    try:
        return int(summary.get("rounds_done", 0))
    except (TypeError, ValueError):
        return 0


ASK_FLOWER_EVERY = 30.0  # seconds between two `flwr ls` while the run directory shows the run going on


def time_limit(flower: FlowerSection, rounds: int) -> float:
    """How long the operator waits for a Flower run before giving up: the connection, then two messages a round
    (train and evaluate) at ``flower.round_timeout`` each, and two minutes more."""
    return flower.connect_timeout + rounds * 2 * flower.round_timeout + 120.0


def follow(cli: FlwrCli, run_id: int, run_dir: Path, *, rounds: int, limit: float, progress: bool) -> str:
    """Wait for Flower run ``run_id`` to finish, showing the rounds done out of ``rounds``, for at most ``limit``
    seconds (``time_limit``); Ctrl-C/SIGTERM stop it and mark the run ``stopped``. Returns Flower's final status
    (``finished:completed`` ...).

    The run is followed through its run directory, which the ServerApp writes on this machine (the operator is
    where the server is: `federation.flower.operator`): its ``summary.json`` says how many rounds are done and
    when the run has ended (a summary left by an earlier attempt, on resume, counts only once rewritten). Flower
    itself is asked (``flwr ls``, a process each time) only every ``ASK_FLOWER_EVERY`` seconds while the run goes
    on (a ServerApp that died without a word is noticed there), and then each second once the run directory says
    the run ended, until Flower reports it finished.
    """
    began = time.monotonic()
    asked = began  # just submitted: Flower is first asked after ASK_FLOWER_EVERY (or when the run directory ends)
    status = "submitted"
    before = _summary(run_dir).get("updated_at")  # an earlier attempt's summary (resume) says nothing of this one
    bar = tqdm(total=rounds, desc=run_dir.name, unit="round", disable=not progress, dynamic_ncols=True)
    try:
        while True:
            summary = _summary(run_dir)
            ended = summary.get("status") in ENDED and summary.get("updated_at") != before
            now = time.monotonic()
            if ended or now - asked >= ASK_FLOWER_EVERY:
                status, asked = cli.run_status(run_id), now
            done = _rounds_done(summary)  # the summary just read, not the file again
            if done > bar.n:
                bar.update(done - bar.n)
            if status.startswith(FINISHED):
                return status
            if now - began > limit:
                raise FederationError(f"the Flower run {run_id} is still {status} after {limit:.0f} s")
            time.sleep(1.0 if ended else 0.5)
    except KeyboardInterrupt as exc:
        cli.stop_run(run_id)
        if (run_dir / SUMMARY_FILE).is_file():
            summary = read_summary_object(run_dir)
            summary.update(status="stopped", error="interrupted", eta_seconds=None, updated_at=now_iso())
            write_json(run_dir / SUMMARY_FILE, summary)
        raise RunStopped(
            f"stopped after round {_rounds_done(_summary(run_dir))}; continue with: gastric-fl train --resume {run_dir}"
        ) from exc
    finally:
        bar.close()


def _failure(cli: FlwrCli, run_id: int, run_dir: Path, status: str) -> FederationError:
    """The one line that explains a run that did not complete: the run's own error if it wrote one, else the
    last error line of the ServerApp's log."""
    error = read_summary_object(run_dir).get("error")
    if error:
        return FederationError(str(error))
    lines = [line.strip() for line in cli.run_log(run_id).splitlines() if "Error" in line or "error:" in line]
    reason = lines[-1] if lines else f"see `flwr log {run_id}` on the SuperLink"
    return FederationError(f"the Flower run {run_id} ended {status}: {reason}")


def submit_and_follow(
    cli: FlwrCli,
    run_dir: Path,
    values: dict[str, ConfigValue],
    work: Path,
    *,
    rounds: int,
    limit: float,
    progress: bool,
) -> dict[str, Any]:
    """Submit the app bundle with ``values``, follow the run to its end (``follow``) and return the run's
    ``summary.json``."""
    run_id = cli.submit_run(FAB_DIR, values, config_file=work / "run-config.toml")
    status = follow(cli, run_id, run_dir, rounds=rounds, limit=limit, progress=progress)
    if status != COMPLETED:
        raise _failure(cli, run_id, run_dir, status)
    summary = read_summary_object(run_dir)
    if summary.get("status") != "finished":
        raise FederationError(str(summary.get("error") or f"the Flower run ended without finishing {run_dir}"))
    return summary


def run_with_flower(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool,
    overwrite: bool,
    progress: bool,
    sites: Sequence[Site] = (),
) -> dict[str, Any]:
    """Run the federation through Flower (``run.engine``: ``flower-sim`` with ``sites``, or ``flower``)."""
    simulated = config.run.engine == "flower-sim"
    ca: Path | None = None
    if not simulated:
        if not config.flower.superlink:
            raise FederationError("run.engine = flower needs the SuperLink: pass --superlink HOST:PORT")
        if config.flower.hospitals < 1:
            raise FederationError("run.engine = flower needs flower.hospitals: how many hospitals take part")
        elsewhere = operator_problem(config.flower.superlink)
        if elsewhere is not None:
            raise FederationError(elsewhere)  # before anything is submitted
        ca = Path(config.flower.root_certificates) if config.flower.root_certificates else None
        if ca is None or not ca.is_file():
            raise FederationError(
                f"flower.root_certificates = {str(ca or '')!r} is not a file: pass --kit KIT (its server/ca.crt) "
                "or --set flower.root_certificates=CA.crt to verify the SuperLink"
            )
    rounds, limit = config.run.rounds, time_limit(config.flower, config.run.rounds)
    with tempfile.TemporaryDirectory(prefix="gastric-fl-flower-") as tmp:
        work = Path(tmp)
        if not simulated:
            cli = FlwrCli(work / "flwr-home", config.flower.superlink, ca)
            values = run_config(config, run_dir, hospitals=config.flower.hospitals, resume=resume, overwrite=overwrite)
            return submit_and_follow(cli, run_dir, values, work, rounds=rounds, limit=limit, progress=progress)
        superlink = SuperLink(workdir=work, simulation=True)
        try:
            superlink.start()
            # one virtual SuperNode per hospital, run.threads CPUs each (Ray packs as many as fit on the machine)
            simulation = {
                "num-supernodes": len(sites),
                "backend.client-resources.num-cpus": max(1, config.run.threads),
                "backend.client-resources.num-gpus": 0,
            }
            cli = FlwrCli(work / "flwr-home", superlink.address, None, simulation=simulation)
            values = run_config(config, run_dir, hospitals=len(sites), resume=resume, overwrite=overwrite, sites=sites)
            return submit_and_follow(cli, run_dir, values, work, rounds=rounds, limit=limit, progress=progress)
        finally:
            superlink.stop()
