"""`gastric-fl federation`: run the federation across the hospitals' own machines (Flower; docs/deployment.md).

* ``init``: the deployment kit: a CA, the SuperLink's certificate, one key pair and a hand-over bundle per hospital;
* ``server``: the SuperLink (TLS, only registered hospitals admitted), the hospitals' public keys registered;
* ``hospital``: one hospital's SuperNode, serving its prepared dataset from its own machine;
* ``demo``: all of it on 127.0.0.1 for one run, then torn down.

A run is submitted with ``gastric-fl train --engine flower --superlink HOST:PORT --kit KIT`` (``federation.flower``).
Every process is started in its own process group and stopped by it when the command ends, fails or is
interrupted (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from federation.errors import FederationError
    from federation.flower.managed_process import ManagedProcess

federation_app = typer.Typer(
    name="federation",
    help="Deploy the federation on the hospitals' own machines (Flower SuperLink + one SuperNode per hospital).",
    no_args_is_help=True,
)


def _wait_while_alive(process: ManagedProcess, what: str, also: ManagedProcess | None = None) -> NoReturn:
    """Serve until Ctrl-C or SIGTERM; a ``process`` (or ``also``) that stops on its own is an error showing its
    log's last lines."""
    while process.alive() and (also is None or also.alive()):
        time.sleep(1.0)
    stopped = process if not process.alive() or also is None else also
    raise _stopped(stopped, what if stopped is process else stopped.name)


def _stopped(process: ManagedProcess, name: str) -> FederationError:
    """A process that stopped on its own, as one error showing its log's last lines."""
    from federation.errors import FederationError

    return FederationError(f"the {name} stopped; last lines of {process.log_path}:\n{process.log_tail()}")


@federation_app.command("init")
def init(
    out: Path = typer.Option(..., "--out", help="Kit folder to create (secret keys inside: keep it safe)."),
    hospitals: int = typer.Option(0, "--hospitals", help="Number of hospitals, named client_00, client_01, ..."),
    names: list[str] = typer.Option([], "--name", help="A hospital's name instead of --hospitals (repeatable)."),
    host: str = typer.Option("localhost", "--host", help="The SuperLink's host name or IP as hospitals dial it."),
    port: int = typer.Option(8000, "--port", help="The SuperLink's port (Fleet, Control and runtime APIs)."),
    also: list[str] = typer.Option([], "--also", help="Another name or IP for the server certificate (repeatable)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a kit this command made earlier."),
    add: str | None = typer.Option(None, "--add", help="Add one hospital to the existing kit --out instead."),
) -> None:
    """Make the deployment kit: CA, server certificate, and per hospital a key pair and a hand-over bundle."""
    from federation.errors import FederationError
    from federation.flower.kit import add_hospital, default_hospital_names, init_kit

    if add is not None:
        bundle = add_hospital(out, add)
        typer.echo(f"added {bundle.name} (index {bundle.index}): hand over {bundle.folder}")
        typer.echo(f"then register it: gastric-fl federation server --kit {out} registers every kit hospital")
        return
    if names and hospitals:
        raise FederationError("give either --hospitals N or --name NAME ..., not both")
    kit = init_kit(
        out,
        list(names) or default_hospital_names(hospitals),
        host=host,
        port=port,
        extra_names=also,
        overwrite=overwrite,
    )
    typer.echo(f"kit {kit.root}: SuperLink {kit.superlink}")
    typer.echo(f"  server machine: keep {kit.server_dir} (server.key is secret)")
    for bundle in kit.hospitals:
        typer.echo(f"  {bundle.name}: hand over {bundle.folder} (supernode.key is secret)")
    typer.echo(f"  {kit.ca_key} signs certificates: keep it offline")


@federation_app.command("allow")
def allow(
    kit: Path = typer.Option(..., "--kit", help="Kit folder (gastric-fl federation init), or its server/ folder."),
    hospital: str = typer.Option(..., "--hospital", help="The hospital's name in the kit."),
    source: list[str] = typer.Option(
        [], "--source", help="An address or network it may connect from (repeatable; none: from anywhere again)."
    ),
    everyone: bool = typer.Option(
        False, "--everyone", help="Accept 0.0.0.0/0 or ::/0 (every address of that family, i.e. everyone)."
    ),
) -> None:
    """Allow a hospital's SuperNode to reach the gate only from these addresses (the server's sources.toml); the
    gate enforces it and logs every request with the hospital it claims to be from its next start."""
    from federation.flower.kit import everyone_networks, set_sources

    networks = set_sources(kit, hospital, source, everyone=everyone)
    where = ", ".join(networks) if networks else "any address"
    typer.echo(f"{hospital} may connect from {where}; restart gastric-fl federation server to apply it")
    for network in everyone_networks(networks):
        typer.echo(
            f"warning: {network} is every IPv{6 if ':' in network else 4} address: {hospital}'s key is accepted from "
            "anywhere on it, as without a list",
            err=True,
        )


@federation_app.command("server")
def server(
    kit: Path = typer.Option(..., "--kit", help="Kit folder (gastric-fl federation init), or its server/ folder."),
    state: Path = typer.Option(
        Path("data/federation/server"), "--state", help="Where the SuperLink keeps its database and logs."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Interface the hospitals' gate listens on (0.0.0.0: every interface)."
    ),
    port: int | None = typer.Option(None, "--port", help="The hospitals' port (default: the kit's)."),
    control_port: int | None = typer.Option(
        None, "--control-port", help="The SuperLink's own port on 127.0.0.1, for the operator (default: port + 1)."
    ),
) -> None:
    """Run the SuperLink with TLS and SuperNode authentication until Ctrl-C, behind the gate: hospitals reach only
    the Fleet API; runs are submitted, listed and stopped on this machine. The kit's hospitals are registered."""
    from federation.flower.fleet_gate import FleetGate
    from federation.flower.flwr_cli import FlwrCli, register_hospitals
    from federation.flower.kit import Kit
    from federation.flower.superlink import SuperLink

    loaded = Kit.load(kit)
    state = state.resolve()
    public = port or loaded.port
    link = SuperLink.from_kit(loaded, state, host="127.0.0.1", port=control_port or public + 1)
    gate = FleetGate(loaded, state, upstream_port=link.port, host=host, port=public)
    with link, gate:
        cli = FlwrCli(state / "flwr-cli", link.address, loaded.ca_cert)
        ids = register_hospitals(cli, loaded, state / "registered.json")
        typer.echo(
            f"hospitals' gate on {host}:{gate.port} (TLS; the Fleet API only; only registered hospitals admitted); "
            f"SuperLink on {link.address} (this machine only); logs in {state}"
        )
        for name, node_id in ids.items():
            typer.echo(f"  registered {name} as node {node_id}")
        typer.echo(
            f"submit a run on this machine: gastric-fl train --engine flower --superlink {link.address} --kit {kit} "
            f"--set flower.hospitals={len(ids)} ..."
        )
        _wait_while_alive(link, "SuperLink", also=gate)


@federation_app.command("hospital")
def hospital(
    data: Path = typer.Option(..., "--data", help="This hospital's prepared dataset (gastric-fl prepare)."),
    bundle: Path = typer.Option(..., "--bundle", help="This hospital's hand-over folder from the kit."),
    data_hospital: int | None = typer.Option(
        None,
        "--client",
        help="Which client of --data holds this hospital's tiles (default: the only one, or its kit index); "
        "its index in the federation is always its bundle's.",
    ),
    state: Path = typer.Option(
        Path("data/federation/hospital"), "--state", help="Where this hospital keeps one folder per run."
    ),
    superlink: str | None = typer.Option(None, "--superlink", help="HOST:PORT (default: the bundle's)."),
    policy: Path | None = typer.Option(
        None,
        "--policy",
        help="This hospital's policy (TOML, configs/hospital_policy.toml): what it accepts and what may leave. "
        "Default: the safe defaults (a head of at least 1 unit stays, BatchNorm statistics stay, bounded training).",
    ),
    retry_for: float = typer.Option(
        90.0,
        "--retry-for",
        help="Seconds to keep starting again while the SuperLink refuses this hospital (after a crash or stop it "
        "counts the old start online for about a minute).",
    ),
) -> None:
    """Run this hospital's SuperNode until Ctrl-C: its tiles, labels and head never leave this machine, and it
    answers only what its policy allows (docs/deployment.md, "Hospital policy")."""
    from federation.flower.kit import load_bundle
    from federation.flower.supernode import SuperNode
    from federation.hospital.data import check_hospitals, manifest_hospitals, read_manifest
    from federation.hospital.policy import load_policy

    rules = load_policy(policy)  # a bad policy file is one line before anything starts
    loaded = load_bundle(bundle)
    rows = read_manifest(data)
    present = manifest_hospitals(rows)
    # its identity in the federation is its bundle's index; its tiles are its own dataset's only client (prepare
    # --clients 1), or, in a dataset of several hospitals (a simulation's), --client (default: that same index)
    own = data_hospital if data_hospital is not None else present[0] if len(present) == 1 else loaded.index
    check_hospitals(data, rows, [own])
    state = state.resolve()
    node_config: dict[str, str | int] = {
        "partition-id": loaded.index,
        "client": loaded.index,
        "data-client": own,
        "data-path": str(data.resolve()),
        "hospital-dir": str(state / "runs"),
        **({"policy": str(policy.resolve())} if policy is not None else {}),
    }
    node = SuperNode.from_bundle(loaded, node_config, state / "supernode", superlink=superlink)
    typer.echo(
        f"{loaded.name}: SuperNode of hospital {loaded.index} (tiles: client {own} of {data}), dialing "
        f"{superlink or loaded.superlink}; "
        f"runs kept in {state / 'runs'}; log {node.log_path}; {rules.source}: methods "
        f"{', '.join(rules.methods)}, at least {rules.min_nhead} head unit(s) stay; what left is recorded in "
        f"{state / 'runs' / 'outbound.jsonl'} (gastric-fl federation audit --state {state})"
    )
    seen: dict[Path, int] = {}

    def score_test_slides() -> None:  # after a run's last round, its held-out slides as predict scores them
        from app.held_out import score_finished

        for line in score_finished(state / "runs", data.resolve(), loaded.index, seen):
            typer.echo(f"{loaded.name}: {line}")

    serve_node(node, retry_for=retry_for, between=score_test_slides)


RETRY_PAUSE_S = 10.0
BETWEEN_S = 5.0


def serve_node(
    node: ManagedProcess,
    *,
    retry_for: float,
    pause: float = RETRY_PAUSE_S,
    between: Callable[[], None] | None = None,
    every: float = BETWEEN_S,
) -> NoReturn:
    """Run a hospital's SuperNode until Ctrl-C or SIGTERM. Refused by the SuperLink (the executor's
    ``REFUSED_EXIT``): the SuperLink may still count this hospital online after a crash or a stop (about a minute,
    until its heartbeats expire), so say so and start again every ``pause`` seconds for up to ``retry_for``
    seconds, then stop with one line naming both causes. Any other stop is an error showing the log's end.
    ``between`` is called every ``every`` seconds while the node runs (the hospital scores its finished runs' test
    slides, `app.held_out.score_finished`)."""
    from federation.errors import FederationError
    from federation.flower.executor import REFUSED_EXIT

    deadline = time.monotonic() + retry_for
    while True:
        with node:
            last = time.monotonic()
            while node.alive():
                time.sleep(min(1.0, pause))
                if between is not None and time.monotonic() - last >= every:
                    between()
                    last = time.monotonic()
        code = node.popen.returncode if node.popen is not None else None
        if code != REFUSED_EXIT:
            raise _stopped(node, "SuperNode")
        left = deadline - time.monotonic()
        if left <= 0:
            raise FederationError(
                f"the SuperLink refused this hospital for {retry_for:g} s: its key is not registered there or was "
                "replaced (a rotated kit), or TLS failed; ask the server's operator to register this hospital's "
                "supernode.pub (gastric-fl federation server does it for every kit hospital at start), and check the "
                f"bundle's ca.crt and address (log: {node.log_path})"
            )
        typer.echo(
            f"the SuperLink refused this hospital: it may still count an earlier start of it online (about a "
            f"minute after a crash or a stop); trying again in {pause:g} s (for {left:.0f} s more)",
            err=True,
        )
        time.sleep(pause)


@federation_app.command("audit")
def audit(
    state: Path = typer.Option(
        ...,
        "--state",
        help="A hospital's state folder (as given to gastric-fl federation hospital --state), or a run's "
        "hospitals/client_XX folder.",
    ),
    anchor: Path | None = typer.Option(
        None,
        "--anchor",
        help="The server's record of every hospital's outbound-log head: the run's anchors.json. The log must "
        "still hold the head this hospital's latest reply in that run carried, and that reply's record.",
    ),
    hospital: int | None = typer.Option(
        None,
        "--hospital",
        help="Which hospital of --anchor this log is (needed when the anchor holds several; never taken from the log).",
    ),
    count: int | None = typer.Option(
        None, "--count", help="A head noted earlier (audit prints it): how many lines the log held then."
    ),
    sha256: str | None = typer.Option(None, "--sha256", help="With --count: the sha256 of the log's line COUNT."),
) -> None:
    """What left this hospital: the runs, the tensors and values sent, every refused request, and whether the
    outbound log is intact (exit 1 if it is not). Only an anchor (--anchor, or --count with --sha256) shows that
    the log kept its end; without one the report says that the end is unchecked."""
    from federation.errors import FederationError
    from federation.hospital.outbound import audit_report, find_outbound
    from federation.server.audit import load_anchor
    from federation.wire.chain import Anchor, parse_head

    path = find_outbound(state)
    anchors: list[Anchor] = []
    if (count is None) != (sha256 is None):
        raise FederationError("give --count N and --sha256 H together: the head audit printed when it was noted")
    if count is not None:
        try:
            head = parse_head({"count": count, "sha256": sha256})
        except FederationError:
            raise FederationError(
                f"--count {count} --sha256 {sha256} is not a head of a log (a count >= 0 and the 64 hex digits of "
                "its last line, 64 zeros for 0 lines): give the head federation audit printed"
            ) from None
        anchors.append(Anchor(head, "the head given"))
    if anchor is not None:  # which hospital: --hospital, or the anchor's only one (never the log's own say)
        anchors.append(load_anchor(anchor, hospital))
    elif hospital is not None:
        raise FederationError("--hospital names a hospital of --anchor FILE: give the run's anchors.json too")
    text, intact = audit_report(path, tuple(anchors))
    typer.echo(text)
    if not intact:
        raise typer.Exit(1)


@federation_app.command("demo")
def demo(
    data: Path = typer.Option(..., "--data", help="A prepared dataset: one SuperNode per hospital in it."),
    out: Path = typer.Option(..., "--out", help="Run directory to create (as gastric-fl train --out)."),
    rounds: int | None = typer.Option(None, "--rounds", help="Rounds (overrides run.rounds)."),
    config: Path | None = typer.Option(None, "--config", "-c", help="TOML preset (defaults for what it leaves out)."),
    overrides: list[str] = typer.Option([], "--set", help="Override one setting (repeatable), as in train."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it holds a run."),
    keep: bool = typer.Option(False, "--keep", help="Keep the kit and the logs beside the run (<out>.deployment)."),
    policy: Path | None = typer.Option(
        None,
        "--policy",
        help="Every hospital's policy file (default: the safe defaults; configs/hospital_policy.toml).",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """The whole deployment on 127.0.0.1 (TLS, SuperNode authentication), one run, then everything torn down."""
    from federation.config import load_config
    from federation.engine import RunStopped
    from federation.flower.demo import run_demo

    extra = [*overrides, "run.engine=flower"] + ([f"run.rounds={rounds}"] if rounds is not None else [])
    cfg = load_config(config, extra, data)
    typer.echo(f"run directory: {out}", err=True)
    scored: list[str] = []

    def score_test_slides() -> None:  # each hospital's own dataset (its slides as hospital 0) still exists here
        from app.held_out import score_run

        scored.extend(score_run(out, device=cfg.run.device))  # where the hospitals trained

    try:
        summary = run_demo(
            cfg, out, overwrite=overwrite, progress=not quiet, keep=keep, policy=policy, finished=score_test_slides
        )
    except RunStopped as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(130) from exc
    timings = summary.get("deployment_timings", {})
    final = summary.get("final") or {}
    typer.echo(
        f"deployment up in {timings.get('startup', 0):.1f} s (SuperLink {timings.get('superlink_healthy', 0):.1f} s, "
        f"SuperNodes online {timings.get('supernodes_online', 0):.1f} s); {summary.get('rounds_done')} rounds, "
        f"{summary.get('seconds_per_round', 0):.1f} s per round; averaged test accuracy "
        f"{final.get('avg_test_acc', 0):.4f}; see {out} (gastric-fl report {out})"
    )
    for line in scored:
        typer.echo(line)


def register(app: typer.Typer) -> None:
    """Add the `federation` command group to `app`."""
    app.add_typer(federation_app, name="federation")
