"""The kit's lifecycle (issue: a federation hospitals can trust, item 6): rotation and removal reach the
SuperLink's registrations, ``init --overwrite`` replaces only what it made, secrets stay private whatever the
umask, and the ``server/`` hand-over alone is a kit a server starts from.

The SuperLink's registry is played by ``FakeRegistry`` with Flower 1.41's rules (a key registers once, an
unregistered node is refused from then on); the real SuperLink is exercised in ``test_flower_deploy.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, cast

import pytest

from federation.errors import FederationError
from federation.flower.flwr_cli import FlwrCli, register_hospitals
from federation.flower.kit import Kit, add_hospital, init_kit


class FakeRegistry:
    """What ``register_hospitals`` asks of ``FlwrCli``, with the SuperLink's rules."""

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}
        self.status: dict[int, str] = {}
        self.calls: list[tuple[str, Any]] = []

    def register_supernode(self, public_key: Path, name: str) -> int:
        key = Path(public_key).read_bytes()
        if key in [k for n, k in self.keys.items() if self.status[n] != "unregistered"]:
            raise FederationError("Public key already in use")
        node_id = 100 + len(self.keys)
        self.keys[node_id], self.status[node_id] = key, "registered"
        self.calls.append(("register", name))
        return node_id

    def unregister_supernode(self, node_id: int) -> None:
        self.status[node_id] = "unregistered"
        self.calls.append(("unregister", node_id))

    def node_status(self) -> dict[int, str]:
        return dict(self.status)

    def accepts(self, public_key: Path) -> bool:
        key = Path(public_key).read_bytes()
        return any(k == key and self.status[n] != "unregistered" for n, k in self.keys.items())


def test_rotated_and_removed_keys_are_unregistered_at_the_next_start(tmp_path: Path) -> None:
    registry = FakeRegistry()
    cli = cast(FlwrCli, registry)
    record = tmp_path / "state" / "registered.json"
    kit = init_kit(tmp_path / "kit", ["a", "b"], host="127.0.0.1")
    old_a, old_b = kit.public_key("a").read_bytes(), kit.public_key("b").read_bytes()
    first = register_hospitals(cli, kit, record)
    assert register_hospitals(cli, kit, record) == first  # a restart with nothing changed registers nothing
    assert [c[0] for c in registry.calls] == ["register", "register"]
    kit = init_kit(tmp_path / "kit", ["a"], host="127.0.0.1", overwrite=True)  # every key new, b removed
    second = register_hospitals(cli, kit, record)
    assert second["a"] != first["a"]
    assert registry.status[first["a"]] == registry.status[first["b"]] == "unregistered"
    (tmp_path / "old_a.pub").write_bytes(old_a)
    (tmp_path / "old_b.pub").write_bytes(old_b)
    assert not registry.accepts(tmp_path / "old_a.pub")
    assert not registry.accepts(tmp_path / "old_b.pub")
    assert registry.accepts(kit.public_key("a"))
    assert set(second) == {"a"}


def test_init_overwrite_keeps_foreign_files_and_refuses_foreign_files_inside_the_kit(tmp_path: Path) -> None:
    out = tmp_path / "kit"
    init_kit(out, ["a"], host="127.0.0.1")
    (out / "notes.txt").write_text("the hospital group's own notes")
    init_kit(out, ["a", "b"], host="127.0.0.1", overwrite=True)
    assert (out / "notes.txt").read_text() == "the hospital group's own notes"
    assert {b.name for b in Kit.load(out).hospitals} == {"a", "b"}
    (out / "server" / "superlink.db").write_bytes(b"someone's state")
    with pytest.raises(FederationError, match=r"superlink\.db inside the kit"):
        init_kit(out, ["a"], host="127.0.0.1", overwrite=True)
    assert (out / "server" / "superlink.db").read_bytes() == b"someone's state"
    assert {b.name for b in Kit.load(out).hospitals} == {"a", "b"}  # the old kit is untouched


def test_secrets_and_their_folders_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        kit = init_kit(tmp_path / "kit", ["a"], host="127.0.0.1")
        add_hospital(kit.root, "b")
    finally:
        os.umask(old)
    for folder in (kit.root, kit.root / "ca", kit.server_dir, kit.server_dir / "hospitals", kit.root / "hospitals"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for name in ("a", "b"):
        assert stat.S_IMODE((kit.root / "hospitals" / name).stat().st_mode) == 0o700
        assert stat.S_IMODE((kit.root / "hospitals" / name / "supernode.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(kit.server_key.stat().st_mode) == 0o600


def test_the_server_folder_alone_is_a_kit_for_the_server(tmp_path: Path) -> None:
    kit = init_kit(tmp_path / "kit", ["a"], host="10.0.0.5", port=8123)
    add_hospital(kit.root, "b")
    handed = tmp_path / "on-the-server"
    kit.server_dir.rename(handed)
    server = Kit.load(handed)
    assert server.server_only
    assert server.port == 8123
    assert server.server_key == handed / "server.key"
    assert server.server_key.is_file()
    assert server.ca_cert.is_file()
    assert [b.name for b in server.hospitals] == ["a", "b"]
    assert server.public_key("b").is_file()
    with pytest.raises(FederationError, match="nor its server/ folder"):
        Kit.load(tmp_path)


def test_a_relative_kit_path_names_absolute_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``federation server --kit kit/server`` failed: nginx resolved the relative certificate path against its own
    state folder. A kit, its server/ folder and a hospital's bundle read from a relative path name absolute files."""
    from federation.flower.kit import load_bundle

    init_kit(tmp_path / "kit", ["a"], host="127.0.0.1")
    monkeypatch.chdir(tmp_path)
    for relative in (Path("kit"), Path("kit") / "server"):
        kit = Kit.load(relative)
        assert kit.root == tmp_path / relative
        assert kit.root.is_absolute()
    bundle = load_bundle(Path("kit") / "hospitals" / "a")
    assert bundle.private_key.is_absolute()
    assert bundle.private_key.is_file()
