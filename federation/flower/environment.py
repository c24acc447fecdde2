"""What a Flower process on this machine is started with: its executable, its environment, its config files, a port.

All ``flwr``/``flower-*`` executables are taken from the folder of ``sys.executable`` (the virtual environment),
and that folder leads ``PATH`` so that Flower's own subprocesses (``flower-superexec``, ``flwr-serverapp``,
``flwr-clientapp``) come from the same environment. Runtime dependency installation, the update check and
telemetry are off (``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``, ``FLWR_DISABLE_UPDATE_CHECK=1``,
``FLWR_TELEMETRY_ENABLED=0``): a hospital machine may be offline, and a FAB is run with what is installed.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from federation import OFFLINE_ENV
from federation.errors import FederationError
from infra.toml import toml_value

ConfigValue = str | int | float | bool | Path
SUPEREXEC_POLL_SECONDS = "0.2"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the kernel's pick; another process may still take it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def dial_host(host: str) -> str:
    """The host this machine dials to reach a server listening on ``host`` (loopback when listening on all)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def listen_port(host: str, port: int | None) -> int:
    """``port``, or a free port of this machine for a server that will listen on ``host`` (on all interfaces: a port
    free on loopback)."""
    return free_port(host if host not in ("0.0.0.0", "::") else "127.0.0.1") if port is None else port


def venv_bin() -> Path:
    """The folder holding this interpreter and the ``flwr``/``flower-*`` executables of the same environment."""
    return Path(sys.executable).parent  # not resolved: a venv's python is a symlink out of the venv


def executable(name: str) -> str:
    """The full path of Flower executable ``name`` in this environment; a ``FederationError`` if it is missing."""
    path = venv_bin() / name
    if not path.is_file():
        raise FederationError(f"{name} not found in {venv_bin()}; install gastric-fl with flwr[simulation] there")
    return str(path)


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


def write_config_file(path: Path, values: Mapping[str, ConfigValue]) -> Path:
    """Write ``values`` to ``path`` as ``config_toml`` (its folder made if missing); ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_toml(values), encoding="utf-8")
    return path
