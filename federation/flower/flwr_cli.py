"""The ``flwr`` CLI of a Flower 1.41 deployment: one connection to a SuperLink, each command stoppable.

``FlwrCli`` runs ``flwr`` from this virtual environment in its own ``FLWR_HOME`` (``federation.flower.environment``),
each command in its own process group, stopped by group if it outlives its timeout: registering SuperNodes,
submitting, watching and stopping runs. ``register_hospitals`` registers a kit's hospitals once and reconciles the
registrations with the kit's keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from federation.errors import FederationError
from federation.flower.environment import ConfigValue, executable, flower_env, write_config_file
from federation.flower.kit import Kit
from infra.outputs import write_atomic
from infra.pids import descendant_groups, stop_groups
from infra.toml import toml_value

CONNECTION = "gastric-fl"  # the connection name written into $FLWR_HOME/config.toml
FINISHED = "finished"
COMPLETED = "finished:completed"


@dataclass
class FlwrCli:
    """The ``flwr`` CLI in its own ``FLWR_HOME``, with one connection to the SuperLink (Flower 1.41 keeps
    connections in ``$FLWR_HOME/config.toml``, not in an app's ``pyproject.toml``)::

        [superlink]
        default = "gastric-fl"

        [superlink.gastric-fl]
        address = "127.0.0.1:9093"
        root-certificates = "/abs/path/ca.crt"     # must be absolute
        # insecure = true                          # instead of root-certificates, for a plain-HTTP SuperLink
    """

    home: Path
    superlink: str
    ca_cert: Path | None
    connection: str = CONNECTION
    timeout: float = 120.0
    simulation: Mapping[str, ConfigValue] | None = None
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f"default = {toml_value(self.connection)}", "", f"[superlink.{self.connection}]"]
        lines.append(f"address = {toml_value(self.superlink)}")
        if self.ca_cert is None:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {toml_value(Path(self.ca_cert).resolve())}")
        # a simulation SuperLink takes its federation from the connection: options.num-supernodes, backend, ...
        lines.extend(f"options.{k} = {toml_value(v)}" for k, v in (self.simulation or {}).items())
        write_atomic(self.home / "config.toml", ("\n".join(lines) + "\n").encode("utf-8"))
        self.env = flower_env(self.home)

    def run(self, *args: str, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``flwr ARGS`` in its own process group (stopped by group if it outlives ``timeout``)."""
        argv = [executable("flwr"), *args]
        limit = self.timeout if timeout is None else timeout
        with subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.home,
            start_new_session=True,
        ) as proc:
            try:
                out, err = proc.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                stop_groups({proc.pid, *descendant_groups(proc.pid)}, grace=1.0)
                proc.communicate()
                raise FederationError(f"`flwr {' '.join(args[:2])}` did not finish within {limit:.0f} s") from None
            except BaseException:
                stop_groups({proc.pid, *descendant_groups(proc.pid)}, grace=1.0)
                proc.communicate()
                raise
        result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check and result.returncode != 0:
            raise FederationError(f"`flwr {' '.join(args[:2])}` failed (exit {result.returncode}): {self._why(result)}")
        return result

    def _why(self, result: subprocess.CompletedProcess[str]) -> str:
        """The CLI's error, with what to do when the address is the hospitals' gate (which refuses control)."""
        text = _cli_error(result)
        if "403 Forbidden" in text and "/v1/control/" in text:
            return (
                f"{self.superlink} is the hospitals' gate, which serves no control: submit, list and stop runs on "
                "the server machine, through the SuperLink's own address that gastric-fl federation server prints "
                "(127.0.0.1:<control port>)"
            )
        return text

    def json(self, *args: str, timeout: float | None = None) -> dict[str, Any]:
        """Run ``flwr ARGS --format json`` and return the JSON object; ``success: false`` raises."""
        result = self.run(*args, "--format", "json", timeout=timeout, check=False)
        data = _last_json(result.stdout)
        if data is None or not data.get("success", False):
            raise FederationError(f"`flwr {' '.join(args[:2])}` failed (exit {result.returncode}): {self._why(result)}")
        return data

    # SuperNodes
    def register_supernode(self, public_key: Path, name: str) -> int:
        """``flwr supernode register KEY.pub CONN --name NAME``: the node id the SuperLink gives it."""
        data = self.json("supernode", "register", str(Path(public_key).resolve()), self.connection, "--name", name)
        return int(data["node-id"])

    def unregister_supernode(self, node_id: int) -> None:
        """``flwr supernode unregister NODE_ID CONN``: the SuperLink refuses that key from now on."""
        self.json("supernode", "unregister", str(node_id), self.connection)

    def list_supernodes(self) -> list[dict[str, Any]]:
        """``flwr supernode list CONN --format json``: dicts with ``node-id`` (a string) and ``status``
        (``registered``, ``online``, ``offline``, ``unregistered``)."""
        return list(self.json("supernode", "list", self.connection)["nodes"])

    def node_status(self) -> dict[int, str]:
        """``node id -> status`` of every registered SuperNode."""
        return {int(n["node-id"]): str(n["status"]) for n in self.list_supernodes()}

    def wait_online(self, node_ids: Iterable[int], timeout: float, *, poll: float = 0.5) -> float:
        """Wait until every node in ``node_ids`` is ``online``; the seconds it took. Raises on timeout."""
        wanted, began = set(node_ids), time.monotonic()
        while True:
            status = self.node_status()
            missing = sorted(n for n in wanted if status.get(n) != "online")
            if not missing:
                return time.monotonic() - began
            if time.monotonic() - began > timeout:
                states = ", ".join(f"{n}: {status.get(n, 'not registered')}" for n in missing)
                raise FederationError(f"SuperNodes not online after {timeout:.0f} s ({states})")
            time.sleep(poll)

    # runs
    def submit_run(self, app_dir: Path, run_config: Mapping[str, ConfigValue], *, config_file: Path) -> int:
        """``flwr run APP_DIR CONN --run-config FILE.toml --format json``: the run id (the run is queued).

        The app is bundled into a FAB by the CLI (``**/*.py|toml|md|json`` files, 10 MB at most), so ``app_dir``
        must hold only the app. ``run_config`` overrides keys of its ``[tool.flwr.app.config]``.
        """
        args = ["run", str(Path(app_dir).resolve()), self.connection]
        if run_config:
            args += ["--run-config", str(write_config_file(config_file, run_config))]
        return int(self.json(*args)["run-id"])

    def run_info(self, run_id: int) -> dict[str, Any]:
        """``flwr ls CONN --run-id ID --format json``: that run's row (``status``, ``status-details``, ...)."""
        runs = self.json("ls", self.connection, "--run-id", str(run_id))["runs"]
        if not runs:
            raise FederationError(f"the SuperLink knows no run {run_id}")
        return dict(runs[0])

    def run_status(self, run_id: int) -> str:
        """``pending``, ``starting``, ``running`` or ``finished:completed|failed|stopped``."""
        return str(self.run_info(run_id)["status"])

    def wait_run(self, run_id: int, timeout: float, *, poll: float = 1.0) -> str:
        """Poll the run's status until it is ``finished:...`` and return it (``flwr run --stream`` exits 0 even
        when the run failed, so the status is read from ``flwr ls``). Raises when ``timeout`` passes."""
        began = time.monotonic()
        while True:
            status = self.run_status(run_id)
            if status.startswith(FINISHED):
                return status
            if time.monotonic() - began > timeout:
                raise FederationError(f"run {run_id} still {status} after {timeout:.0f} s")
            time.sleep(poll)

    def stop_run(self, run_id: int) -> None:
        """``flwr stop ID CONN``: the run ends as ``finished:stopped``."""
        self.json("stop", str(run_id), self.connection)

    def run_log(self, run_id: int, timeout: float = 30.0) -> str:
        """``flwr log ID CONN --show``: the ServerApp's log of a run, as far as the SuperLink has it."""
        result = self.run("log", str(run_id), self.connection, "--show", timeout=timeout, check=False)
        return result.stdout + result.stderr


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(line)
                return value if isinstance(value, dict) else None
    with contextlib.suppress(json.JSONDecodeError):
        value = json.loads(text)
        return value if isinstance(value, dict) else None
    return None


def _cli_error(result: subprocess.CompletedProcess[str]) -> str:
    data = _last_json(result.stdout)
    if data is not None and data.get("error-message"):
        return str(data["error-message"]).strip().replace("\n", " ")
    text = (result.stderr or result.stdout or "").strip().splitlines()
    return " ".join(line.strip() for line in text[-3:]) or "no output"


def register_hospitals(cli: FlwrCli, kit: Kit, record: Path, names: Iterable[str] | None = None) -> dict[str, int]:
    """Register the kit's hospitals (all, or ``names``) with the SuperLink; ``name -> node id``.

    The SuperLink keeps registrations in its database and refuses a key twice ("Public key already in use"),
    and ``flwr supernode list`` shows neither names nor keys; so the ids, with the sha256 of each registered
    public key, are kept in ``record`` (a JSON file next to the SuperLink's database) and a hospital found there
    with the same key is not registered again. Called for the whole kit (``names=None``: every start of
    ``gastric-fl federation server``), it also reconciles: a registered key that the kit no longer holds (a
    hospital removed, or its key rotated by ``init --overwrite`` or by hand) is unregistered, so the old key is
    refused from then on, and the kit's new key is registered. Safe to call after every start.
    """
    known: dict[str, dict[str, Any]] = {}
    if record.is_file():
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            for name, value in json.loads(record.read_text(encoding="utf-8")).items():
                entry = value if isinstance(value, dict) else {"node_id": value}  # the older format: id only
                known[str(name)] = {"node_id": int(entry["node_id"]), "key_sha256": entry.get("key_sha256")}
    in_kit = {b.name for b in kit.hospitals}
    wanted = sorted(in_kit) if names is None else list(names)
    keys = {n: hashlib.sha256(kit.public_key(n).read_bytes()).hexdigest() for n in wanted}
    status = cli.node_status() if known else {}

    def save() -> None:
        record.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(record, json.dumps(known, indent=1, sort_keys=True).encode("utf-8"))

    stale = [
        n
        for n, entry in known.items()
        if (names is None and n not in in_kit)
        or (n in keys and entry["key_sha256"] is not None and entry["key_sha256"] != keys[n])
    ]
    for name in stale:
        if status.get(known[name]["node_id"], "unregistered") != "unregistered":
            cli.unregister_supernode(known[name]["node_id"])
        del known[name]
        save()
    for name in wanted:
        mine = known.get(name)
        if mine is not None and status.get(mine["node_id"], "unregistered") != "unregistered":
            if mine["key_sha256"] is None:  # recorded before keys were: remember the key it was registered with
                mine["key_sha256"] = keys[name]
                save()
            continue
        known[name] = {"node_id": cli.register_supernode(kit.public_key(name), name), "key_sha256": keys[name]}
        save()
    return {n: int(known[n]["node_id"]) for n in wanted}
