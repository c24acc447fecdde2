"""The names that code outside ``federation.flower`` still imports from here, each re-exported from its own module.

The processes of a Flower deployment live in modules of one concern each:

* ``federation.flower.environment``: the executables, environment and config files of Flower processes, a free port;
* ``federation.flower.managed_process``: ``ManagedProcess``, a command in its own process group, and
  ``StoppedOnExit``, what a ``with`` block starts and stops;
* ``federation.flower.superlink``: ``SuperLink``; ``federation.flower.fleet_gate``: ``FleetGate``, the nginx gate in
  front of it; ``federation.flower.supernode``: ``SuperNode``;
* ``federation.flower.flwr_cli``: ``FlwrCli`` and ``register_hospitals``;
* ``federation.flower.local_deployment``: ``NodeSpec`` and ``LocalDeployment``, a whole deployment on one machine.

New code imports from those modules; nothing in them imports this one.
"""

from __future__ import annotations

# app/cmd_federation.py imports ManagedProcess, FleetGate, FlwrCli, SuperLink, register_hospitals and SuperNode;
# federation/flower/runner.py imports COMPLETED, FINISHED, ConfigValue, FlwrCli and SuperLink
from federation.flower.environment import ConfigValue as ConfigValue
from federation.flower.fleet_gate import FleetGate as FleetGate
from federation.flower.flwr_cli import COMPLETED as COMPLETED
from federation.flower.flwr_cli import FINISHED as FINISHED
from federation.flower.flwr_cli import FlwrCli as FlwrCli
from federation.flower.flwr_cli import register_hospitals as register_hospitals
from federation.flower.managed_process import ManagedProcess as ManagedProcess
from federation.flower.superlink import SuperLink as SuperLink
from federation.flower.supernode import SuperNode as SuperNode
