"""Processes of a Flower 1.41 deployment: the SuperLink, SuperNodes and the ``flwr`` CLI, each one stoppable.

Every process is started in its own session and process group (``start_new_session=True``) and stopped by
signalling that group (``os.killpg``: SIGTERM, then SIGKILL after a grace period), never by name. Flower starts
helpers of its own: the SuperLink launches ``flower-superexec`` *detached* in a new session
(``flwr.supercore.utils.get_popen_detach_kwargs``), which in turn starts one ``flwr-serverapp`` per run; a
SuperNode starts its ``flower-superexec`` and one ``flwr-clientapp`` per message inside its own group. So before a
group is signalled, its descendants are looked up in ``/proc`` (by parent id, not by name) and every other group
they lead is stopped as well. The helpers watch their parent with ``kill(pid, 0)``, which a zombie still answers,
so a stopped process is always reaped (``Popen.wait``).

All ``flwr``/``flower-*`` executables are taken from the folder of ``sys.executable`` (the virtual environment),
and that folder leads ``PATH`` so that Flower's own subprocesses (``flower-superexec``, ``flwr-serverapp``,
``flwr-clientapp``) come from the same environment. Runtime dependency installation, the update check and
telemetry are off (``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, ``FLWR_DISABLE_UPDATE_CHECK=1``,
``FLWR_TELEMETRY_ENABLED=0``): a hospital machine may be offline, and a FAB is run with what is installed.

The context managers (``SuperLink``, ``SuperNode``, ``LocalDeployment``) stop what they started when the block
ends, raises, or is interrupted; while one is open in the main thread, SIGTERM and SIGHUP (when they still have
their default action) raise ``Terminated``, a ``KeyboardInterrupt``, so that the teardown runs. An ``atexit``
hook stops anything still running when the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import math
import os
import pwd
import secrets
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from federation import OFFLINE_ENV
from federation.errors import FederationError
from federation.flower.gate import gate_config, nginx_executable
from federation.flower.kit import HospitalBundle, Kit, join_address, write_secret
from infra.outputs import Terminated as Terminated
from infra.outputs import terminate_as_interrupt
from infra.pids import STOP_GRACE, descendant_groups, still_ours, stop_groups
from infra.toml import toml_value

ConfigValue = str | int | float | bool | Path
CONNECTION = "gastric-fl"  # the connection name written into $FLWR_HOME/config.toml
LOG_TAIL_LINES = 30
FINISHED = "finished"
COMPLETED = "finished:completed"


# -- small helpers ---------------------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel's pick; another process may still take it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def venv_bin() -> Path:
    """The folder holding this interpreter and the ``flwr``/``flower-*`` executables of the same environment."""
    return Path(sys.executable).parent  # not resolved: a venv's python is a symlink out of the venv


def executable(name: str) -> str:
    """The full path of Flower executable ``name`` in this environment; a ``FederationError`` if it is missing."""
    path = venv_bin() / name
    if not path.is_file():
        raise FederationError(f"{name} not found in {venv_bin()}; install gastric-fl with flwr[simulation] there")
    return str(path)


SUPEREXEC_POLL_SECONDS = "0.2"


def flower_env(flwr_home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a Flower process: its own ``FLWR_HOME``, this venv first on ``PATH``, nothing downloaded."""
    env = dict(os.environ if base is None else base)
    env["FLWR_HOME"] = str(flwr_home)
    env["PATH"] = os.pathsep.join([str(venv_bin()), env.get("PATH", "")]).rstrip(os.pathsep)
    env.update(OFFLINE_ENV)  # no update check, no telemetry (federation.OFFLINE_ENV)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    # the server's SuperExec looks for a submitted run's ServerApp to start every second by default (0.01-60 s)
    env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = SUPEREXEC_POLL_SECONDS
    env["PYTHONUNBUFFERED"] = "1"  # the log files show a crash's last lines
    return env


def config_toml(values: Mapping[str, ConfigValue]) -> str:
    """A flat mapping as TOML (``key = value`` lines), the form Flower's ``--run-config``/``--node-config`` read.

    Flower parses ``'k=v k2="s"'`` strings with a regular expression that breaks on quotes and spaces inside
    values; a ``.toml`` file path is read with a TOML parser instead (``flwr.common.config.parse_config_args``),
    so the deployment always passes a file.
    """
    lines = []
    for key, value in values.items():
        if not key or not all(c.isalnum() or c in "-_" for c in key):
            raise FederationError(f"config key {key!r} must be letters, digits, '-' or '_'")
        if not isinstance(value, bool | int | float | str | Path):
            raise FederationError(f"config value {key} must be str, int, float or bool, got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise FederationError(f"config value {key} = {value} is not finite")
        lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def _write_config_file(path: Path, values: Mapping[str, ConfigValue]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_toml(values), encoding="utf-8")
    return path


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


_LIVE: set[ManagedProcess] = set()  # strong references: a dropped deployment is still stopped at exit


@atexit.register
def _stop_all_at_exit() -> None:
    for process in list(_LIVE):
        with contextlib.suppress(Exception):
            process.stop(grace=1.0)


class ManagedProcess:
    """One command in its own session/process group, its output appended to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_path
        self.env = dict(env)
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._groups: dict[int, int | None] = {}  # groups to stop: its own and its descendants' (detached helpers)
        self._seen: set[int] = set()  # every group ever recorded, for checks; never signalled after a stop
        self._signals: contextlib.AbstractContextManager[None] = contextlib.nullcontext()

    @property
    def pid(self) -> int | None:
        """The process id (= its process group id) while started."""
        return None if self.popen is None else self.popen.pid

    @property
    def groups(self) -> set[int]:
        """Every process group this process and its descendants were seen in since it was first started."""
        self.track()
        return set(self._seen)

    def start(self) -> None:
        """Start the command in a new session; its stdout and stderr go to the log file."""
        if self.alive():
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.cwd.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n--- {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
        self._log.flush()
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise FederationError(f"cannot start {self.name} ({self.argv[0]}): {exc.strerror or exc}") from exc
        self._groups = descendant_groups(self.popen.pid) or {self.popen.pid: None}
        self._seen.update(self._groups)
        _LIVE.add(self)

    def alive(self) -> bool:
        """True while the main process runs (a dead one is reaped here)."""
        if self.popen is None:
            return False
        self.track()
        return self.popen.poll() is None

    def track(self) -> None:
        """Remember the groups of its current descendants, so that they can be stopped after it is gone."""
        if self.popen is not None and self.popen.returncode is None:
            self._groups.update(descendant_groups(self.popen.pid))
            self._seen.update(self._groups)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop its process group and every group its descendants lead; reap it; close the log."""
        if self.popen is None:
            return
        self.track()
        stop_groups(still_ours(self._groups), grace=grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5.0)
        self._groups = {}  # stopped: never signal these ids again (they may be recycled)
        self._close_log()
        _LIVE.discard(self)

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until it exits (``None``: no limit); its exit code, or None if still running after ``timeout``.

        For commands that run one process in the foreground: ``with SuperNode.from_bundle(...) as node:
        node.wait()`` (Ctrl-C or SIGTERM unwind the block and stop the node's whole group).
        """
        if self.popen is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.alive():
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.5)  # polled, not Popen.wait(): descendants' groups are tracked meanwhile
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL its group at once (a crash, as a test wants it); its detached helpers are stopped as well."""
        self.stop(grace=0.0)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of its log file."""
        return _tail(self.log_path, lines)

    def log_text(self) -> str:
        """The whole log file."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        """Start it; until the block ends, SIGTERM/SIGHUP unwind like Ctrl-C so that ``__exit__`` stops it."""
        self._signals = terminate_as_interrupt()
        self._signals.__enter__()
        try:
            self.start()
        except BaseException:
            self._signals.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            self._signals.__exit__(exc_type, exc, tb)


# -- the SuperLink ---------------------------------------------------------------------------------------------------
class SuperLink(ManagedProcess):
    """``flower-superlink`` with TLS and SuperNode authentication, on one HTTPS port for the Fleet, Control and
    runtime APIs (Flower 1.41: ``--host/--port``), its state in an SQLite ``--database`` file so that registered
    SuperNodes and runs survive a restart.

    ``start`` returns once ``GET https://HOST:PORT/health`` (Flower's health router) answers 200 over TLS verified
    with the CA, i.e. the certificate and the port work; it raises with the log's tail if the process dies or
    ``ready_timeout`` passes. Without certificates it is a plain-HTTP SuperLink (``--insecure``), and with
    ``simulation`` it runs Flower's simulation runtime instead of waiting for SuperNodes (``train --engine
    flower-sim``, on 127.0.0.1 only).
    """

    def __init__(
        self,
        *,
        ca_cert: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        workdir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        ready_timeout: float = 90.0,
        supernode_auth: bool = True,
        simulation: bool = False,
    ) -> None:
        self.host = host
        self.port = free_port(host if host not in ("0.0.0.0", "::") else "127.0.0.1") if port is None else port
        self.ca_cert = None if ca_cert is None else Path(ca_cert).resolve()
        self.ready_timeout = ready_timeout
        self.database = Path(workdir).resolve() / "superlink.db"
        if self.ca_cert is not None and cert is not None and key is not None:
            security = ["--ssl-ca-certfile", str(self.ca_cert), "--ssl-certfile", str(Path(cert).resolve())]
            security += ["--ssl-keyfile", str(Path(key).resolve())]
            security += ["--enable-supernode-auth"] if supernode_auth else []
        elif ca_cert is None and cert is None and key is None:
            security = ["--insecure"]  # plain HTTP: only for a SuperLink nothing outside this machine dials
        else:
            raise FederationError("a TLS SuperLink needs its CA certificate, certificate and key together")
        argv = [
            executable("flower-superlink"),
            *security,
            *(["--simulation"] if simulation else []),
            "--disable-runtime-dependency-installation",
            "--isolation",
            "subprocess",
            "--host",
            host,
            "--port",
            str(self.port),
            "--database",
            str(self.database),
        ]
        home = Path(workdir).resolve() / "superlink-home"
        super().__init__(
            "SuperLink", argv, log_path=Path(workdir).resolve() / "superlink.log", env=flower_env(home), cwd=home
        )
        self.started_in: float | None = None

    @classmethod
    def from_kit(cls, kit: Kit, workdir: Path, *, host: str = "127.0.0.1", port: int | None = None) -> SuperLink:
        """A SuperLink with the kit's server certificate and key."""
        return cls(ca_cert=kit.ca_cert, cert=kit.server_cert, key=kit.server_key, workdir=workdir, host=host, port=port)

    @property
    def address(self) -> str:
        """``HOST:PORT`` that SuperNodes and the CLI dial on this machine (loopback when listening on all)."""
        return join_address(self._probe_host(), self.port)

    def _probe_host(self) -> str:
        return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)

    def start(self) -> None:
        """Start and wait until healthy; ``started_in`` holds the seconds it took."""
        if self.alive():
            return
        began = time.monotonic()
        super().start()
        try:
            self._wait_healthy()
        except BaseException:
            self.stop(grace=1.0)
            raise
        self.track()
        self.started_in = time.monotonic() - began

    def restart(self) -> float:
        """Stop and start again on the same port and database; the seconds until healthy again."""
        self.stop()
        self.start()
        return float(self.started_in or 0.0)

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200 (over TLS verified with the CA, unless the SuperLink is plain HTTP)."""
        context = None if self.ca_cert is None else ssl.create_default_context(cafile=str(self.ca_cert))
        url = f"{'http' if self.ca_cert is None else 'https'}://{self.address}/health"
        try:
            with urllib.request.urlopen(url, context=context, timeout=2.0) as response:
                return int(response.status) == 200
        except ssl.SSLCertVerificationError as exc:
            raise FederationError(f"the SuperLink's certificate does not verify for {self.address}: {exc}") from exc
        except (urllib.error.URLError, OSError):
            return False

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if not self.alive():
                code = self.popen.returncode if self.popen else None
                raise FederationError(
                    f"the SuperLink exited (code {code}) before it was ready; last lines of {self.log_path}:\n"
                    + self.log_tail()
                )
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise FederationError(
                    f"the SuperLink was not healthy at https://{self.address}/health after {self.ready_timeout:.0f} s;"
                    f" last lines of {self.log_path}:\n" + self.log_tail()
                )
            time.sleep(0.25)


# -- the gate in front of the SuperLink (federation.flower.gate) -----------------------------------------------
class FleetGate(ManagedProcess):
    """nginx in front of a SuperLink on 127.0.0.1:``upstream_port``, listening on ``host:port`` with TLS."""

    def __init__(
        self, kit: Kit, workdir: Path, *, upstream_port: int, host: str = "127.0.0.1", port: int | None = None
    ):
        workdir = Path(workdir).resolve()
        self.host = host
        self.port = free_port(host if host not in ("0.0.0.0", "::") else "127.0.0.1") if port is None else port
        self.ca_cert = kit.ca_cert
        self.ready_timeout = 30.0
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "gate.conf"
        conf.write_text(
            gate_config(kit=kit, workdir=workdir, host=host, port=self.port, upstream_port=upstream_port),
            encoding="utf-8",
        )
        temp = workdir / "gate-temp"
        temp.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(temp, nobody.pw_uid, nobody.pw_gid)
        argv = [nginx_executable(), "-c", str(conf), "-p", str(workdir), "-e", str(workdir / "gate-error.log")]
        super().__init__(
            "gate (nginx)", argv, log_path=workdir / "gate.log", env=flower_env(workdir / "gate-home"), cwd=workdir
        )

    @property
    def address(self) -> str:
        """``HOST:PORT`` the SuperNodes dial (loopback when listening on every interface)."""
        probe = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return join_address(probe, self.port)

    def start(self) -> None:
        """Start nginx and wait until ``/health`` answers through it (i.e. the SuperLink behind it is up)."""
        if self.alive():
            return
        super().start()
        deadline = time.monotonic() + self.ready_timeout
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        while True:
            if not self.alive():
                code = self.popen.returncode if self.popen else None
                raise FederationError(
                    f"the gate (nginx) exited (code {code}); last lines of its log:\n{self.log_tail()}\n"
                    + _tail_file(Path(self.cwd) / "gate-error.log")
                )
            try:
                with urllib.request.urlopen(f"https://{self.address}/health", context=context, timeout=2.0) as r:
                    if int(r.status) == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop(grace=1.0)
                raise FederationError(
                    f"the gate at https://{self.address}/health did not answer within {self.ready_timeout:.0f} s; "
                    + _tail_file(Path(self.cwd) / "gate-error.log")
                )
            time.sleep(0.2)


def _tail_file(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- SuperNodes ------------------------------------------------------------------------------------------------------
class SuperNode(ManagedProcess):
    """``flower-supernode`` for one hospital: it dials the SuperLink over TLS (``--root-certificates``), signs its
    requests with its private key (``--auth-supernode-private-key``) and serves its own runtime API for its
    ``flwr-clientapp`` processes on ``127.0.0.1:--port`` (one port per SuperNode on a machine).

    ``node_config`` becomes ``context.node_config`` in the ClientApp (e.g. ``partition-id``, ``data-path``,
    ``hospital-dir``). ``insecure=True`` connects without TLS (for the test that such a SuperNode is refused).
    ``executor=True`` (every hospital): the SuperNode runs in ``--isolation process`` under the hospital's own
    executor (``federation.flower.executor``), which answers with the installed hospital code and never installs
    or imports the run's app; ``False`` runs Flower's own ``flwr-clientapp`` per message (only for tests that need
    Flower's behaviour itself).
    """

    def __init__(
        self,
        *,
        name: str,
        superlink: str,
        node_config: Mapping[str, ConfigValue],
        workdir: Path,
        root_certificates: Path | None,
        private_key: Path | None,
        insecure: bool = False,
        port: int | None = None,
        max_retries: int | None = None,
        executor: bool = True,
    ) -> None:
        workdir = Path(workdir).resolve()
        self.node_name = name
        self.superlink = superlink
        self.node_config = dict(node_config)
        self.port = free_port() if port is None else port
        config_file = _write_config_file(workdir / "node-config.toml", self.node_config)
        argv = [executable("flower-supernode"), "--superlink", superlink]
        if insecure:
            argv.append("--insecure")
        elif root_certificates is not None:
            argv += ["--root-certificates", str(Path(root_certificates).resolve())]
        if private_key is not None:
            argv += ["--auth-supernode-private-key", str(Path(private_key).resolve())]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--node-config", str(config_file)]
        if max_retries is not None:
            argv += ["--max-retries", str(max_retries)]
        if executor:
            # the hospital's own executor answers the tasks with the installed code (federation.flower.executor);
            # the run's app bundle is never installed or imported. Its runtime API takes a shared secret.
            secret = workdir / "superexec.secret"
            workdir.mkdir(parents=True, exist_ok=True)
            write_secret(secret, secrets.token_bytes(32), replace=True)
            argv += ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
            argv = [
                sys.executable,
                "-m",
                "federation.flower.executor",
                "--runtime",
                f"127.0.0.1:{self.port}",
                "--secret-file",
                str(secret),
                "--",
                *argv,
            ]
        else:
            argv += ["--isolation", "subprocess"]  # runtime dependency installation is off unless --allow-...
        home = workdir / "flwr-home"
        super().__init__(f"SuperNode {name}", argv, log_path=workdir / "supernode.log", env=flower_env(home), cwd=home)

    @classmethod
    def from_bundle(
        cls,
        bundle: HospitalBundle,
        node_config: Mapping[str, ConfigValue],
        workdir: Path,
        *,
        superlink: str | None = None,
        port: int | None = None,
    ) -> SuperNode:
        """The SuperNode of a hospital's hand-over bundle (its key, the CA, the server address unless given)."""
        return cls(
            name=bundle.name,
            superlink=superlink or bundle.superlink,
            node_config=node_config,
            workdir=workdir,
            root_certificates=bundle.ca_cert,
            private_key=bundle.private_key,
            port=port,
        )


# -- the flwr CLI ----------------------------------------------------------------------------------------------------
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
        lines = ["[superlink]", f"default = {json.dumps(self.connection)}", "", f"[superlink.{self.connection}]"]
        lines.append(f"address = {json.dumps(self.superlink)}")
        if self.ca_cert is None:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {json.dumps(str(Path(self.ca_cert).resolve()))}")
        # a simulation SuperLink takes its federation from the connection: options.num-supernodes, backend, ...
        lines.extend(f"options.{k} = {json.dumps(v)}" for k, v in (self.simulation or {}).items())
        (self.home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
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
            args += ["--run-config", str(_write_config_file(config_file, run_config))]
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
        record.write_text(json.dumps(known, indent=1, sort_keys=True), encoding="utf-8")

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


# -- a whole deployment on one machine -------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeSpec:
    """A SuperNode to start: its hospital name (its key and bundle in the kit) and its ``node_config``."""

    name: str
    node_config: Mapping[str, ConfigValue]


class LocalDeployment:
    """A whole TLS + SuperNode-authenticated deployment on this machine: the kit's SuperLink on loopback behind the
    gate (``FleetGate``: the hospitals' only way in, the Fleet API alone; ``gate=False``: the SuperLink itself on
    ``host:port``), and one SuperNode per entry of ``nodes`` (registered with its public key from the kit, then
    started), ready once all are online.

    ::

        with LocalDeployment(kit, [("client_00", {"partition-id": 0}), ...], workdir=tmp) as dep:
            run_id = dep.submit_run(app_dir, {"num-server-rounds": 2})
            status = dep.wait_run(run_id, timeout=600)      # "finished:completed"

    Everything started is stopped when the block ends, raises, or gets Ctrl-C/SIGTERM. ``timings`` records
    ``superlink_healthy``, ``supernodes_online`` and ``startup`` in seconds.
    """

    def __init__(
        self,
        kit: Kit | Path,
        nodes: Sequence[NodeSpec | tuple[str, Mapping[str, ConfigValue]]],
        *,
        workdir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        online_timeout: float = 120.0,
        ready_timeout: float = 90.0,
        gate: bool = True,
    ) -> None:
        self.kit = kit if isinstance(kit, Kit) else Kit.load(kit)
        self.nodes = [n if isinstance(n, NodeSpec) else NodeSpec(n[0], dict(n[1])) for n in nodes]
        for spec in self.nodes:
            self.kit.hospital(spec.name)
        self.workdir = Path(workdir).resolve()
        self.online_timeout = online_timeout
        self.gate: FleetGate | None = None
        if gate:
            # the SuperLink on loopback; hospitals reach only the gate, which passes the Fleet API alone
            self.superlink = SuperLink.from_kit(self.kit, self.workdir, host="127.0.0.1")
            self.gate = FleetGate(self.kit, self.workdir, upstream_port=self.superlink.port, host=host, port=port)
        else:
            self.superlink = SuperLink.from_kit(self.kit, self.workdir, host=host, port=port)
        self.superlink.ready_timeout = ready_timeout
        # the operator's CLI talks to the SuperLink itself (Control API), on this machine
        self.cli = FlwrCli(self.workdir / "flwr-cli", self.superlink.address, self.kit.ca_cert)
        self.supernodes: dict[str, SuperNode] = {}
        self.node_ids: dict[str, int] = {}
        self.timings: dict[str, float] = {}
        self._runs = 0
        self._signals: contextlib.AbstractContextManager[None] | None = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` the SuperNodes dial: the gate's (or, without one, the SuperLink's)."""
        return self.gate.address if self.gate is not None else self.superlink.address

    # lifecycle
    def start(self) -> Self:
        """Start the SuperLink, register and start every SuperNode, wait until all are online."""
        began = time.monotonic()
        self.superlink.start()
        if self.gate is not None:
            self.gate.start()
        self.timings["superlink_healthy"] = float(self.superlink.started_in or 0.0)
        online_began = time.monotonic()
        for spec in self.nodes:
            self.add_supernode(spec.name, spec.node_config, wait=False)
        self.wait_online(self.node_ids.values())
        self.timings["supernodes_online"] = time.monotonic() - online_began
        self.timings["startup"] = time.monotonic() - began
        return self

    def close(self) -> None:
        """Stop every SuperNode, then the SuperLink (each by its process groups)."""
        try:
            for node in list(self.supernodes.values()):
                node.stop(grace=2.0)
        finally:
            try:
                if self.gate is not None:
                    self.gate.stop()
            finally:
                self.superlink.stop()

    def __enter__(self) -> Self:
        self._signals = terminate_as_interrupt()
        self._signals.__enter__()
        try:
            return self.start()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        finally:
            if self._signals is not None:
                self._signals.__exit__(exc_type, exc, tb)
                self._signals = None

    # SuperNodes
    def register(self, name: str) -> int:
        """Register hospital ``name``'s public key from the kit (once per SuperLink database); its node id."""
        self.node_ids.update(register_hospitals(self.cli, self.kit, self.workdir / "registered.json", [name]))
        return self.node_ids[name]

    def add_supernode(
        self,
        name: str,
        node_config: Mapping[str, ConfigValue],
        *,
        register: bool = True,
        private_key: Path | None = None,
        authenticate: bool = True,
        insecure: bool = False,
        max_retries: int | None = None,
        wait: bool = True,
    ) -> SuperNode:
        """Start a SuperNode for hospital ``name`` (registering its key first unless ``register=False``).

        ``private_key`` replaces the kit's key (e.g. a key the SuperLink does not know); ``authenticate=False``
        gives it no key at all; ``insecure`` dials without TLS; ``max_retries`` bounds its reconnection attempts
        (Flower's default: unbounded). With ``wait`` (and a registered key), returns once the node is online.
        """
        bundle = self.kit.hospital(name)
        if register and name not in self.node_ids:
            self.register(name)
        node = SuperNode(
            name=name,
            superlink=self.address,
            node_config=node_config,
            workdir=self.workdir / "supernodes" / name,
            root_certificates=bundle.ca_cert,
            private_key=None if not authenticate else bundle.private_key if private_key is None else private_key,
            insecure=insecure,
            max_retries=max_retries,
        )
        old = self.supernodes.get(name)
        if old is not None:
            old.stop(grace=1.0)
        self.supernodes[name] = node
        node.start()
        if wait and register:
            self.wait_online([self.node_ids[name]])
        return node

    def kill_supernode(self, name: str) -> None:
        """SIGKILL hospital ``name``'s SuperNode group (and its ClientApp processes), as a crash would."""
        node = self.supernodes.get(name)
        if node is None:
            raise FederationError(f"no SuperNode {name!r} runs in this deployment")
        node.kill()

    def restart_supernode(self, name: str, *, wait: bool = True) -> SuperNode:
        """Start hospital ``name``'s SuperNode again with its node config."""
        node = self.supernodes.get(name)
        if node is None:
            raise FederationError(f"no SuperNode {name!r} was started in this deployment")
        node.stop(grace=1.0)
        node.start()
        if wait and name in self.node_ids:
            self.wait_online([self.node_ids[name]])
        return node

    def wait_online(self, node_ids: Iterable[int], timeout: float | None = None) -> float:
        """Wait until the given nodes are online; fail early with a SuperNode's log tail if one exited."""
        wanted = list(node_ids)
        began = time.monotonic()
        limit = self.online_timeout if timeout is None else timeout
        by_id = {v: k for k, v in self.node_ids.items()}
        while True:
            for node_id in wanted:
                node = self.supernodes.get(by_id.get(node_id, ""))
                if node is not None and not node.alive():
                    raise FederationError(
                        f"{node.name} exited before it came online; last lines of {node.log_path}:\n" + node.log_tail()
                    )
            try:
                return self.cli.wait_online(wanted, timeout=min(5.0, limit))
            except FederationError:
                if time.monotonic() - began > limit:
                    raise

    # the SuperLink
    def stop_superlink(self) -> None:
        """Stop the SuperLink (SuperNodes keep running and retry the connection)."""
        self.superlink.stop()

    def restart_superlink(self, *, wait: bool = True) -> float:
        """Start the SuperLink again on the same port and database (registrations and runs survive); with
        ``wait``, until every running registered SuperNode is online again (they reconnect by themselves).
        The seconds it took."""
        began = time.monotonic()
        self.superlink.restart()
        if wait:
            running = [self.node_ids[n] for n, node in self.supernodes.items() if n in self.node_ids and node.alive()]
            self.wait_online(running)
        return time.monotonic() - began

    # runs
    def submit_run(self, app_dir: Path, run_config: Mapping[str, ConfigValue] | None = None) -> int:
        """Submit the app in ``app_dir`` with ``run_config``; the run id."""
        self._runs += 1
        config_file = self.workdir / "runs" / f"run-config-{self._runs}.toml"
        return self.cli.submit_run(app_dir, run_config or {}, config_file=config_file)

    def wait_run(self, run_id: int, timeout: float, *, poll: float = 1.0) -> str:
        """Wait for the run to finish; its final status (``finished:completed`` on success)."""
        return self.cli.wait_run(run_id, timeout, poll=poll)

    def stop_run(self, run_id: int) -> None:
        """Stop a run (``flwr stop``)."""
        self.cli.stop_run(run_id)

    def process_groups(self) -> set[int]:
        """Every process group started here (SuperLink, SuperNodes and their helpers' groups)."""
        groups = self.superlink.groups | (self.gate.groups if self.gate is not None else set())
        for node in self.supernodes.values():
            groups |= node.groups
        return groups
