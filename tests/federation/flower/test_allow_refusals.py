"""`gastric-fl federation allow` refuses what the gate (nginx) cannot take and says what "everyone" means (issue 48,
part 5): an IPv6 zone id is refused in one line, before sources.toml is written and when a hand-edited one is read;
0.0.0.0/0 and ::/0 need --everyone and then print a plain warning; a gate that cannot start names sources.toml."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.cli import run_cli

from federation.errors import FederationError
from federation.flower.environment import free_port
from federation.flower.fleet_gate import FleetGate
from federation.flower.gate import nginx_executable
from federation.flower.kit import Kit, init_kit


@pytest.fixture
def kit(tmp_path: Path) -> Path:
    init_kit(tmp_path / "kit", ["a", "b"], host="127.0.0.1")
    return tmp_path / "kit"


def _allow(monkeypatch: pytest.MonkeyPatch, kit: Path, *args: str) -> int:
    return run_cli(monkeypatch, "federation", "allow", "--kit", str(kit), "--hospital", "a", *args)


def test_a_zone_id_is_refused_and_sources_toml_is_not_written(
    kit: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _allow(monkeypatch, kit, "--source", "fe80::1%eth0") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: --source for a: 'fe80::1%eth0' carries an IPv6 zone id ('%eth0'), which the gate (nginx) cannot "
        "match: give the address without it, or the hospital's routable address"
    )
    assert not Kit.load(kit).sources_file.exists()
    # without the zone id it is an address nginx takes
    assert _allow(monkeypatch, kit, "--source", "fe80::1") == 0
    assert Kit.load(kit).sources() == {"a": ("fe80::1/128",)}


def test_a_hand_written_zone_id_in_sources_toml_is_refused_naming_the_file(kit: Path) -> None:
    loaded = Kit.load(kit)
    loaded.sources_file.write_text('[sources]\nb = ["10.0.0.1", "fe80::1%eth0"]\n', encoding="utf-8")
    with pytest.raises(FederationError) as err:
        Kit.load(kit).sources()
    assert str(err.value).startswith(f"{loaded.sources_file}: b: 'fe80::1%eth0' carries an IPv6 zone id ('%eth0')")


@pytest.mark.parametrize(("network", "family"), [("0.0.0.0/0", 4), ("::/0", 6)])
def test_every_address_needs_everyone_and_then_says_so(
    kit: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], network: str, family: int
) -> None:
    assert _allow(monkeypatch, kit, "--source", "10.1.2.0/24", "--source", network) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --source for a: {network} allows every IPv{family} address, i.e. everyone, as if there were no list: "
        "give the hospital's own network, or pass --everyone to mean it"
    )
    assert not Kit.load(kit).sources_file.exists()
    assert _allow(monkeypatch, kit, "--source", "10.1.2.0/24", "--source", network, "--everyone") == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == (
        f"a may connect from 10.1.2.0/24, {network}; restart gastric-fl federation server to apply it"
    )
    assert captured.err.strip() == (
        f"warning: {network} is every IPv{family} address: a's key is accepted from anywhere on it, as without a list"
    )
    assert Kit.load(kit).sources() == {"a": ("10.1.2.0/24", network)}


def test_a_gate_that_cannot_start_names_sources_toml(kit: Path, tmp_path: Path) -> None:
    try:
        nginx_executable()
    except FederationError:
        pytest.skip("nginx is not installed (the gate's own tests need it)")
    loaded = Kit.load(kit)
    with socket.socket() as taken:  # the gate's port is held by another process: nginx exits at once
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        gate = FleetGate(loaded, tmp_path / "state", upstream_port=free_port(), port=taken.getsockname()[1])
        with pytest.raises(FederationError) as err:
            gate.start()
    first = str(err.value).splitlines()[0]
    assert first.startswith("the gate (nginx) exited (code 1) with its configuration ")
    assert f"the server's sources.toml ({loaded.sources_file}: check its addresses" in first
    assert "Address already in use" in str(err.value)
