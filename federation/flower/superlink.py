"""The SuperLink of a Flower 1.41 deployment (``flower-superlink``), one stoppable process ready once healthy.

It is a ``ManagedProcess`` (``federation.flower.managed_process``): started in its own process group and stopped
with every group its descendants lead, among them the ``flower-superexec`` it launches *detached* in a new session
(``flwr.supercore.utils.get_popen_detach_kwargs``), which in turn starts one ``flwr-serverapp`` per run. Its
executable and environment are this virtual environment's (``federation.flower.environment``).
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

from federation.errors import FederationError
from federation.flower.environment import executable, flower_env, listen_port
from federation.flower.kit import Kit
from federation.flower.managed_process import ListeningProcess


class SuperLink(ListeningProcess):
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
        self.port = listen_port(host, port)
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
