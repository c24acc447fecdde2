"""The hospital's Flower app: a ``ClientApp`` that is a hospital (``federation.hospital.handler.Hospital``).

It reads its prepared data and its folder from the node configuration (``data-path``, ``client``,
``hospital-dir``) in a deployment, or from the simulation's partition id. Its head and checkpoints live in that
folder, never in module globals: a deployed SuperNode starts a fresh process per message, and Ray reuses one actor
for several simulated hospitals. Nothing here loads the server's code (tests/test_dependencies.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from federation.errors import FederationError, first_line
from federation.flower.records import from_record, to_record
from federation.hospital.handler import Hospital, Site
from federation.hospital.policy import load_policy
from federation.runfiles import hospital_name
from federation.wire.codec import encode
from federation.wire.contract import Failure


def hospital_site(node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> Site:
    """Where this node's hospital is.

    Deployed: the SuperNode's ``--node-config`` names ``data-path`` (its prepared dataset), ``client`` (which
    client of it; default its ``partition-id``, then 0) and ``hospital-dir`` (where it keeps one folder per run;
    with ``per-run = false``, the folder itself).
    Simulated (``run.engine = "flower-sim"``, all on one machine): the run configuration names the dataset, its
    clients in partition order and the run's ``hospitals/`` folder, as in the local engine.
    """
    if "data-path" not in node_config and str(run_config.get("sim-data-path", "")):
        # only where the node names no dataset of its own: a deployed hospital never takes paths from a run
        hospitals = [int(c) for c in str(run_config["sim-clients"]).split(",")]
        hospital = hospitals[int(node_config["partition-id"])]
        root = Path(str(run_config["sim-hospitals-dir"])) / hospital_name(hospital)
        return Site(Path(str(run_config["sim-data-path"])), hospital, root)
    try:
        dataset = Path(str(node_config["data-path"]))
        root = Path(str(node_config["hospital-dir"]))
    except KeyError as exc:
        raise FederationError(
            f"the SuperNode's --node-config lacks {exc.args[0]!r}: start it with gastric-fl federation hospital"
        ) from exc
    hospital = int(node_config.get("client", node_config.get("partition-id", 0)))
    rows = node_config.get("data-client")  # its tiles' client in its own dataset, when not its federation index
    # per-run (default): one folder per run under hospital-dir; false: hospital-dir is this run's folder (the demo,
    # which keeps each hospital's folder inside the run as the local engine does)
    per_run = str(node_config.get("per-run", "true")).lower() not in ("false", "0", "no")
    # the hospital's own policy (federation.hospital.policy): the file its operator named, else the safe defaults;
    # never anything the run carries
    policy_file = str(node_config.get("policy", ""))
    policy = load_policy(Path(policy_file) if policy_file else None)
    return Site(
        dataset, hospital, root, per_run=per_run, policy=policy, rows=None if rows in (None, "") else int(str(rows))
    )


def client_app() -> ClientApp:
    """The hospital ``ClientApp``: every message is answered by ``Hospital`` from the node's own folder."""
    app = ClientApp()

    def handle(message: Message, context: Context) -> Message:
        try:
            site = hospital_site(context.node_config, context.run_config)
        except FederationError as exc:  # a SuperNode started by hand with a bad --node-config or policy
            failure = encode(Failure(int(context.node_config.get("client", -1)), first_line(exc)))
            return Message(to_record(failure), reply_to=message)
        reply = Hospital(site).answer(from_record(message.content))
        return Message(to_record(reply), reply_to=message)

    app.query()(handle)
    app.train()(handle)
    app.evaluate()(handle)
    return app
