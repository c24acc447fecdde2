"""A per-hospital source allow-list at the gate (issue 34, item 6): a copied hospital key used from another address
is refused by nginx before the SuperLink sees it, and every request is logged with the hospital it claims to be.
The gate's real nginx runs with its real configuration; no SuperLink stands behind it, so a request the gate lets
through is answered 502 (bad gateway) and one it refuses 403."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from federation.errors import FederationError
from federation.flower.environment import free_port
from federation.flower.fleet_gate import FleetGate
from federation.flower.gate import nginx_executable
from federation.flower.kit import Kit, init_kit, set_sources


def _nginx_or_skip() -> None:
    try:
        nginx_executable()
    except FederationError:
        pytest.skip("nginx is not installed (the gate's own tests need it)")


def _status(port: int, ca: Path, key: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"https://127.0.0.1:{port}/v1/fleet/ping", data=b"", method="POST")
    if key is not None:
        request.add_header("flwr-public-key", key)
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_hospital_key_from_an_address_outside_its_list_is_refused_and_logged(tmp_path: Path) -> None:
    _nginx_or_skip()
    init_kit(tmp_path / "kit", ["a", "b", "c"], host="127.0.0.1")
    assert set_sources(tmp_path / "kit", "a", ["10.9.9.0/24"]) == ("10.9.9.0/24",)
    assert set_sources(tmp_path / "kit", "b", ["127.0.0.1", "::1"]) == ("127.0.0.1/32", "::1/128")
    kit = Kit.load(tmp_path / "kit")
    assert kit.sources() == {"a": ("10.9.9.0/24",), "b": ("127.0.0.1/32", "::1/128")}
    gate = FleetGate(kit, tmp_path / "state", upstream_port=free_port())
    argv = gate.argv
    process = subprocess.Popen(argv, cwd=tmp_path / "state", start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", gate.port)) == 0:
                    break
            time.sleep(0.1)
        seen = {
            name: _status(gate.port, kit.ca_cert, kit.fleet_key(name) if name != "none" else None)
            for name in ("a", "b", "c", "none")
        }
        assert seen["a"][0] == 403  # a's key from 127.0.0.1, outside its 10.9.9.0/24: stopped at the gate
        assert "may not connect from this address" in seen["a"][1]
        assert seen["b"][0] == 502  # b's key from an allowed address: passed on (no SuperLink behind: 502)
        assert seen["c"][0] == 502  # no list for c: any address
        assert seen["none"][0] == 502  # no key at all: the SuperLink refuses it itself
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    log = (tmp_path / "state" / "gate-access.log").read_text().splitlines()
    assert len(log) == 4
    assert '" 403 hospital=a source_ok=0' in log[0]
    assert '" 502 hospital=b source_ok=1' in log[1]
    assert '" 502 hospital=c source_ok=1' in log[2]
    assert '" 502 hospital=- source_ok=1' in log[3]
    # emptied, the list allows any address again; bad entries are one line
    assert set_sources(tmp_path / "kit", "a", []) == ()
    assert set(Kit.load(tmp_path / "kit").sources()) == {"b"}
    with pytest.raises(FederationError, match=r"'10\.9\.9\.300' is not an IP address or network"):
        set_sources(tmp_path / "kit", "a", ["10.9.9.300"])
    with pytest.raises(FederationError, match="no hospital"):
        set_sources(tmp_path / "kit", "zz", ["10.0.0.1"])
    kit.sources_file.write_text('[sources]\nzz = ["10.0.0.1"]\n')
    with pytest.raises(FederationError, match="'zz' is not a hospital of this kit"):
        Kit.load(tmp_path / "kit").sources()


def test_the_gate_names_a_hospital_by_the_header_flowers_supernode_sends(tmp_path: Path) -> None:
    """``Kit.fleet_key`` is what Flower's own SuperNode interceptor puts in ``flwr-public-key`` for that key."""
    from base64 import b64encode

    from cryptography.hazmat.primitives import serialization
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    kit = init_kit(tmp_path / "kit", ["a", "b"], host="127.0.0.1")
    for bundle in kit.hospitals:
        private = serialization.load_ssh_private_key(bundle.private_key.read_bytes(), password=None)
        sent = b64encode(public_key_to_bytes(private.public_key())).decode("ascii")  # type: ignore[arg-type]
        assert kit.fleet_key(bundle.name) == sent
    assert kit.fleet_key("a") != kit.fleet_key("b")
