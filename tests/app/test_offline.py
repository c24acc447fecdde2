"""Nothing phones home (docs/design.md, "Trust model"): the product's entry points, run with every outbound connection
other than loopback trapped, make no attempt to reach anything.

Each entry point runs in a fresh interpreter whose ``sitecustomize`` replaces ``socket.getaddrinfo`` and
``socket.socket.connect`` with versions that record any address that is not loopback (and refuse it). The
library switches (``federation.OFFLINE_ENV``) are removed from the environment first, so the product must set
them itself. The control, a bare ``import albumentations``, shows that the trap does catch an update check.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.tiny_dataset import TINY_SETTINGS, make_dataset

from federation import OFFLINE_ENV

TRAP = """
import os, socket
_LOG = os.environ["OUTBOUND_TRAP_LOG"]
_LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0", ""}

def _note(host):
    if str(host) not in _LOOPBACK and not str(host).startswith("127."):
        with open(_LOG, "a") as handle:
            handle.write(f"{host}\\n")
        raise OSError(f"outbound connection to {host} refused by the test")

_getaddrinfo = socket.getaddrinfo
def getaddrinfo(host, *args, **kwargs):
    _note(host)
    return _getaddrinfo(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo

_connect = socket.socket.connect
def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _note(address[0])
    return _connect(self, address)
socket.socket.connect = connect
"""


def trapped_run(
    tmp_path: Path, argv: list[str], *, keep_env: bool = False
) -> tuple[subprocess.CompletedProcess[str], str]:
    trap = tmp_path / "trap"
    trap.mkdir(exist_ok=True)
    (trap / "sitecustomize.py").write_text(TRAP)
    log = tmp_path / "outbound.log"
    log.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if keep_env or k not in OFFLINE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(trap), str(Path.cwd())])
    env["OUTBOUND_TRAP_LOG"] = str(log)
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return result, log.read_text() if log.exists() else ""


def test_the_trap_catches_a_library_update_check(tmp_path: Path) -> None:
    _, attempts = trapped_run(tmp_path, [sys.executable, "-c", "import albumentations"])
    assert attempts.strip(), "albumentations' update check was not seen: the trap does not work"


@pytest.mark.parametrize(
    "entry",
    ["train", "clientapp", "serverapp"],
)
def test_no_entry_point_contacts_anything_but_loopback(tmp_path: Path, entry: str) -> None:
    if entry == "train":
        data = make_dataset(tmp_path / "tiny")
        sets = [a for s in (*TINY_SETTINGS, "run.rounds=1") for a in ("--set", s)]
        argv = [
            sys.executable,
            "-m",
            "app.cli",
            "train",
            "--data",
            str(data),
            "--out",
            str(tmp_path / "run"),
            "-q",
            *sets,
        ]
    else:
        app = "hospital_app.client_app" if entry == "clientapp" else "apps.server_app"
        code = (
            f"import federation.hospital.trainer, federation.flower.{app.split('.')[0]} as a; a.{app.split('.')[1]}()"
        )
        argv = [sys.executable, "-c", code]
    result, attempts = trapped_run(tmp_path, argv)
    assert result.returncode == 0, result.stderr[-2000:]
    assert attempts == ""
