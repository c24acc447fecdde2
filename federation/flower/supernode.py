"""A hospital's SuperNode (``flower-supernode``): it dials the SuperLink and answers the tasks of its hospital.

It is a ``ManagedProcess`` (``federation.flower.managed_process``): started in its own process group, where it
starts its ``flower-superexec`` and one ``flwr-clientapp`` per message (or, for every hospital, the hospital's own
executor, ``federation.flower.executor``), and stopped with that group and every group its descendants lead. Its
executable, environment and ``--node-config`` file come from ``federation.flower.environment``.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from federation.flower.environment import ConfigValue, executable, flower_env, free_port, write_config_file
from federation.flower.kit import HospitalBundle, write_secret
from federation.flower.managed_process import ManagedProcess


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
        config_file = write_config_file(workdir / "node-config.toml", self.node_config)
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
