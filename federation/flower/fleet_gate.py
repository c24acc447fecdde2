"""The server's gate as a process: nginx in front of the SuperLink, the hospitals' only way in (the Fleet API alone).

Its configuration, and why the SuperLink is never reached directly, are ``federation.flower.gate``'s. Here nginx
runs in the foreground in its own process group (a ``ManagedProcess``, ``federation.flower.managed_process``) with
its configuration, logs and temporary files in the server's state folder, ready once ``/health`` answers through
it, and is stopped with that group.
"""

from __future__ import annotations

import os
import pwd
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

from federation.errors import FederationError
from federation.flower.environment import flower_env, listen_port
from federation.flower.gate import gate_config, nginx_executable
from federation.flower.kit import Kit
from federation.flower.managed_process import ListeningProcess


class FleetGate(ListeningProcess):
    """nginx in front of a SuperLink on 127.0.0.1:``upstream_port``, listening on ``host:port`` with TLS."""

    def __init__(
        self, kit: Kit, workdir: Path, *, upstream_port: int, host: str = "127.0.0.1", port: int | None = None
    ):
        workdir = Path(workdir).resolve()
        self.host = host
        self.port = listen_port(host, port)
        self.ca_cert = kit.ca_cert
        self.sources_file = kit.sources_file  # its addresses are written into the configuration (gate.py)
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
                    f"the gate (nginx) exited (code {code}) with its configuration {Path(self.cwd) / 'gate.conf'}, "
                    f"made from the kit and the server's sources.toml ({self.sources_file}: check its addresses, or "
                    "rewrite them with gastric-fl federation allow); last lines of its log:\n"
                    f"{self.log_tail()}\n" + _tail_file(Path(self.cwd) / "gate-error.log")
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
