"""A whole Flower deployment on one machine: the kit's SuperLink behind its gate, and one SuperNode per hospital.

``LocalDeployment`` starts the SuperLink (``federation.flower.superlink``), the gate the hospitals dial
(``federation.flower.fleet_gate``), registers each hospital's public key with the ``flwr`` CLI
(``federation.flower.flwr_cli``) and starts its SuperNode (``federation.flower.supernode``); it submits, watches and
stops runs, and stops, kills and restarts the processes as a test or a demo wants. As a context manager
(``federation.flower.managed_process.StoppedOnExit``) it stops everything it started when the block ends, raises,
or is interrupted (Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from federation.errors import FederationError
from federation.flower.environment import ConfigValue
from federation.flower.fleet_gate import FleetGate
from federation.flower.flwr_cli import FlwrCli, register_hospitals
from federation.flower.kit import Kit
from federation.flower.managed_process import StoppedOnExit
from federation.flower.superlink import SuperLink
from federation.flower.supernode import SuperNode


@dataclass(frozen=True)
class NodeSpec:
    """A SuperNode to start: its hospital name (its key and bundle in the kit) and its ``node_config``."""

    name: str
    node_config: Mapping[str, ConfigValue]


class LocalDeployment(StoppedOnExit):
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

    def _start_block(self) -> None:
        self.start()

    def _stop_block(self) -> None:
        self.close()

    def _undo_failed_start(self) -> None:
        self.close()  # stop whatever of it had started

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
