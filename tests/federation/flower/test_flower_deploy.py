"""The deployment kit and a real Flower deployment on 127.0.0.1: TLS, SuperNode authentication, teardown.

One SuperLink (module fixture) serves every deployment test: two registered SuperNodes, plus one with a key the
SuperLink does not know and one dialling without TLS, all started together while the echo app runs, so that the
refusals cost no extra wall time. Nothing started here may outlive the module: the fixture checks every process
group it started after teardown.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support.checks import every
from support.paths import REPO

from federation.errors import FederationError
from federation.flower.flwr_cli import register_hospitals
from federation.flower.kit import Kit, add_hospital, init_kit, load_bundle, write_secret
from federation.flower.kit_certs import new_key, openssh_private, openssh_public
from federation.flower.local_deployment import LocalDeployment, NodeSpec
from federation.flower.superlink import SuperLink
from federation.flower.supernode import SuperNode
from federation.hospital.outbound import OUTBOUND_FILE, read_outbound
from infra.pids import group_members

ECHO_APP = Path(__file__).parent / "flower_echo_app"
REGISTERED = ["client_00", "client_01"]


def _alive(groups: set[int]) -> dict[int, list[int]]:
    return {g: members for g in groups if (members := group_members(g))}


# -- the kit ---------------------------------------------------------------------------------------------------------
def test_init_makes_a_verifiable_kit(tmp_path: Path) -> None:
    kit = init_kit(
        tmp_path / "kit", ["client_00", "client_01"], host="fl.example.org", port=9093, extra_names=["10.1.2.3"]
    )

    ca = x509.load_pem_x509_certificate(kit.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(kit.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "fl.example.org"}
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "10.1.2.3"}

    for key_file in (kit.server_key, kit.ca_key):
        key = serialization.load_pem_private_key(key_file.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
    for index, name in enumerate(["client_00", "client_01"]):
        bundle = load_bundle(kit.root / "hospitals" / name)
        assert (bundle.name, bundle.index, bundle.superlink) == (name, index, "fl.example.org:9093")
        private = serialization.load_ssh_private_key(bundle.private_key.read_bytes(), None)
        public = serialization.load_ssh_public_key(bundle.public_key.read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert private.curve.name == public.curve.name == "secp384r1"
        assert private.public_key().public_numbers() == public.public_numbers()
        assert bundle.public_key.read_bytes().startswith(b"ecdsa-sha2-nistp384 ")
        assert kit.public_key(name).read_bytes() == bundle.public_key.read_bytes()
        assert bundle.ca_cert.read_bytes() == kit.ca_cert.read_bytes()

    secrets = [kit.server_key, kit.ca_key, *(b.private_key for b in kit.hospitals)]
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert every(
        stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in (kit.root / "ca", *(b.folder for b in kit.hospitals))
    )
    # The server side holds no hospital private key; a hospital's bundle holds no server or CA key.
    assert not [p for p in kit.server_dir.rglob("*") if p.name.endswith(".key") and p != kit.server_key]
    assert sorted(p.name for p in kit.hospitals[0].folder.iterdir()) == [
        "bundle.toml",
        "ca.crt",
        "supernode.key",
        "supernode.pub",
    ]


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    kit = init_kit(tmp_path / "kit", ["a", "b"])
    old_key = kit.hospitals[0].private_key.read_bytes()
    with pytest.raises(FederationError, match="already holds a kit; pass --overwrite"):
        init_kit(tmp_path / "kit", ["a", "b"])
    assert kit.hospitals[0].private_key.read_bytes() == old_key

    renewed = init_kit(tmp_path / "kit", ["a", "b", "c"], overwrite=True)
    assert [b.name for b in renewed.hospitals] == ["a", "b", "c"]
    assert renewed.hospitals[0].private_key.read_bytes() != old_key
    assert [p.name for p in tmp_path.iterdir()] == ["kit"]  # no staging folder left behind

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FederationError, match="was not made by `federation init`"):
        init_kit(foreign, ["a"], overwrite=True)
    assert (foreign / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("names", "options", "message"),
    [
        ([], {}, "at least one hospital"),
        (["a", "a"], {}, "repeated: a"),
        (["../x"], {}, "hospital name '../x'"),
        (["a"], {"port": 70000}, "port must be between"),
        (["a"], {"extra_names": ["bad host!"]}, "neither an IP address nor a host name"),
    ],
)
def test_init_rejects_bad_input(tmp_path: Path, names: list[str], options: dict[str, object], message: str) -> None:
    with pytest.raises(FederationError, match=message):
        init_kit(tmp_path / "kit", names, **options)  # type: ignore[arg-type]
    assert not (tmp_path / "kit").exists()


def test_add_hospital_extends_the_kit(tmp_path: Path) -> None:
    init_kit(tmp_path / "kit", ["a"])
    bundle = add_hospital(tmp_path / "kit", "b")
    assert (bundle.name, bundle.index) == ("b", 1)
    kit = Kit.load(tmp_path / "kit")
    assert [h.name for h in kit.hospitals] == ["a", "b"]
    assert kit.public_key("b").read_bytes() == bundle.public_key.read_bytes()
    with pytest.raises(FederationError, match="already has a hospital 'b'"):
        add_hospital(tmp_path / "kit", "b")


# -- a deployment on 127.0.0.1 ---------------------------------------------------------------------------------------
@dataclass
class Deployed:
    dep: LocalDeployment
    run_id: int
    out_file: Path
    rogue: SuperNode  # a key the SuperLink never registered
    plain: SuperNode  # no TLS
    submitted_at: float


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    root = tmp_path_factory.mktemp("deploy")
    kit = init_kit(root / "kit", [*REGISTERED, "rogue", "plain"], host="127.0.0.1")
    nodes = [
        NodeSpec(name, {"partition-id": i, "hospital-dir": str(root / f"h {i}")}) for i, name in enumerate(REGISTERED)
    ]
    dep = LocalDeployment(kit, nodes, workdir=root / "work")
    groups: set[int] = set()
    try:
        dep.start()
        out_file = root / "echo.json"
        submitted_at = time.monotonic()
        run_id = dep.submit_run(
            ECHO_APP,
            {"out-file": str(out_file), "num-nodes": 2, "connect-timeout": 60.0, "canary": str(root / "canary")},
        )
        rogue = dep.add_supernode("rogue", {"partition-id": 7}, register=False, wait=False)
        plain = dep.add_supernode(
            "plain", {"partition-id": 8}, register=False, insecure=True, authenticate=False, max_retries=1, wait=False
        )
        yield Deployed(dep, run_id, out_file, rogue, plain, submitted_at)
    finally:
        groups = dep.process_groups()
        dep.close()
    assert groups, "no process group was recorded"
    assert not _alive(groups), f"processes left running: {_alive(groups)}"


def _wait_exit(node: SuperNode, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while node.alive():
        assert time.monotonic() < deadline, f"{node.name} still running; log:\n{node.log_tail()}"
        time.sleep(0.2)
    assert node.popen is not None
    assert node.popen.returncode is not None
    return node.popen.returncode


@pytest.mark.slow
def test_unregistered_supernode_is_refused(deployed: Deployed) -> None:
    code = _wait_exit(deployed.rogue)
    assert code != 0
    assert "Failed to activate SuperNode" in deployed.rogue.log_text()
    # said in words at the hospital, by its executor: what happened and what to do
    assert "the SuperLink refused this hospital" in deployed.rogue.log_text()
    assert "register this hospital's supernode.pub" in deployed.rogue.log_text()
    assert "No SuperNode found with the given public key" in deployed.dep.superlink.log_text()
    online = {n for n, s in deployed.dep.cli.node_status().items() if s == "online"}
    assert online == set(deployed.dep.node_ids.values())  # the two registered ones only


@pytest.mark.slow
def test_supernode_without_tls_is_refused(deployed: Deployed) -> None:
    code = _wait_exit(deployed.plain)
    assert code != 0
    log = deployed.plain.log_text()
    assert "Starting insecure channel" in log
    assert "could not establish a connection to the SuperLink" in log
    assert len(deployed.dep.cli.node_status()) == 2  # nothing joined


@pytest.mark.slow
def test_a_run_carrying_foreign_code_is_refused_at_every_hospital(deployed: Deployed) -> None:
    """The echo app reaches both authenticated hospitals over TLS, and both refuse it: their executor never installs
    or imports a run's app (federation.flower.executor), so its canary file is never written."""
    dep = deployed.dep
    status = dep.wait_run(deployed.run_id, timeout=180, poll=0.5)
    round_trip = time.monotonic() - deployed.submitted_at
    assert status == "finished:completed", dep.cli.run_log(deployed.run_id)
    result = json.loads(deployed.out_file.read_text())
    assert result["connected"] == 2  # neither the unregistered nor the plain-HTTP SuperNode got in
    assert result["replies"] == []
    assert len(result["errors"]) == 2
    for error in result["errors"]:
        assert "refused by the hospital: the run carries the app 'gastric-fl/gastric-fl-echo'" in error
    assert {int(e.split(":", 1)[0]) for e in result["errors"]} == set(dep.node_ids.values())
    assert not (deployed.out_file.parent / "canary").exists()
    # each refusal was recorded in the hospital's outbound log before it left (federation.hospital.outbound)
    for i in range(2):
        log = read_outbound(deployed.out_file.parent / f"h {i}" / OUTBOUND_FILE)
        assert log.problems == []
        assert [(r["kind"], r["refused"], r["client"]) for r in log.records] == [("failure", True, i)]
        assert log.records[0]["run"] == f"flower run {deployed.run_id} (gastric-fl/gastric-fl-echo)"
    print(f"\ntimings: {dep.timings}, echo round trip {round_trip:.1f} s")  # shown with -s


@pytest.mark.slow
def test_superlink_restart_keeps_registrations_then_kill_a_supernode(deployed: Deployed) -> None:
    dep = deployed.dep
    old_groups = dep.superlink.groups
    seconds = dep.restart_superlink()  # same port and database; the SuperNodes reconnect by themselves
    assert not _alive(old_groups - dep.superlink.groups)  # the old SuperLink and its SuperExec are gone
    # Registrations live in the database: both SuperNodes are online again under their old node ids.
    assert dep.cli.node_status() == dict.fromkeys(dep.node_ids.values(), "online")
    assert dep.cli.run_status(deployed.run_id) == "finished:completed"  # and so do runs
    print(f"\nSuperLink restart until both SuperNodes online: {seconds:.1f} s")

    node = dep.supernodes["client_01"]
    groups = node.groups
    dep.kill_supernode("client_01")  # as a crash: SIGKILL to its group, its SuperExec included
    assert not node.alive()
    assert not _alive(groups)


@pytest.mark.slow
def test_a_rotated_key_revokes_the_old_one_on_the_real_superlink(deployed: Deployed, tmp_path: Path) -> None:
    """Rotation reaches the real SuperLink: client_01's key is replaced in the kit (as ``init --overwrite`` or an
    administrator would), the SuperLink restarts and the server reconciles its registrations with the kit (what
    every start of ``federation server`` does); the old key is refused from then on, the new one joins."""
    dep = deployed.dep
    bundle = dep.kit.hospital("client_01")
    old_key = tmp_path / "old_supernode.key"
    old_key.write_bytes(bundle.private_key.read_bytes())
    old_key.chmod(0o600)
    old_id = dep.node_ids["client_01"]
    key = new_key()
    write_secret(bundle.private_key, openssh_private(key), replace=True)
    public = openssh_public(key, comment="client_01")
    for path in (bundle.public_key, dep.kit.public_key("client_01")):
        path.unlink()
        path.write_bytes(public)
    dep.restart_superlink(wait=False)
    ids = register_hospitals(dep.cli, dep.kit, dep.workdir / "registered.json")
    assert ids["client_00"] == dep.node_ids["client_00"]  # unchanged key: the same registration
    assert ids["client_01"] != old_id
    assert dep.cli.node_status()[old_id] == "unregistered"
    dep.node_ids.update(ids)
    config = {"partition-id": 1, "hospital-dir": str(tmp_path / "h1")}
    stale = dep.add_supernode("client_01", config, register=False, private_key=old_key, max_retries=1, wait=False)
    assert _wait_exit(stale) != 0
    assert "the SuperLink refused this hospital" in stale.log_text()
    dep.add_supernode("client_01", config, register=False, wait=False)
    dep.wait_online([ids["client_01"]])
    assert dep.cli.node_status()[ids["client_01"]] == "online"


# -- failure and teardown --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_superlink_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    kit = init_kit(tmp_path / "kit", ["a"])
    link = SuperLink(ca_cert=kit.ca_cert, cert=kit.server_cert, key=tmp_path / "missing.key", workdir=tmp_path / "w")
    with pytest.raises(FederationError, match="the SuperLink exited") as info:
        link.start()
    assert "missing.key" in str(info.value)  # the tail of its log says what was wrong
    assert not _alive(link.groups)


@pytest.mark.slow
def test_sigterm_tears_down_the_superlink(tmp_path: Path) -> None:
    kit = init_kit(tmp_path / "kit", ["a"])
    script = textwrap.dedent(
        f"""
        import json, time
        from pathlib import Path
        from federation.flower.kit import Kit
        from federation.flower.superlink import SuperLink
        with SuperLink.from_kit(Kit.load(Path({str(kit.root)!r})), Path({str(tmp_path / "w")!r})) as link:
            print(json.dumps(sorted(link.groups)), flush=True)
            time.sleep(120)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        groups = set(json.loads(child.stdout.readline()))
        assert len(groups) == 2  # the SuperLink and its detached SuperExec
        assert _alive(groups)
        os.kill(child.pid, signal.SIGTERM)
        _, err = child.communicate(timeout=30)
        assert child.returncode != 0
        assert "Terminated: stopped by SIGTERM" in err  # unwound like Ctrl-C, so the context manager ran
        assert not _alive(groups)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
