"""The operator of a deployed run is refused before submitting unless it is where the run's records will be: on
the SuperLink's machine, as the SuperLink's user (``federation.flower.operator``; trust issue, item 7)."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.flower.environment import free_port
from federation.flower.operator import listeners, operator_problem

GASTRIC_FL = Path(sys.executable).parent / "gastric-fl"

# /proc/net/tcp and tcp6 as the kernel writes them (proc(5)): addresses in host byte order per 32-bit word
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 111 1 0 100 0 0 10 0
   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 112 1 0 100 0 0 10 0
   2: 0100007F:1F41 0100007F:A2B4 01 00000000:00000000 00:00000000 00000000     0        0 113 1 0 100 0 0 10 0
   3: 0501000A:1F42 00000000:0000 0A 00000000:00000000 00:00000000 00000000     7        0 114 1 0 100 0 0 10 0
"""
TCP6 = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
    "tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000001000000:1F43 00000000000000000000000000000000:0000 0A 00000000:00000000 "
    "00:00000000 00000000  1002        0 115 1 0 100 0 0 10 0\n"
)


@pytest.fixture
def tables(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "tcp").write_text(TCP)
    (tmp_path / "tcp6").write_text(TCP6)
    return tmp_path / "tcp", tmp_path / "tcp6"


def test_listening_sockets_are_read_with_their_owner(tables: tuple[Path, Path]) -> None:
    assert listeners(8001, tables) == [("127.0.0.1", 1001)]  # the established connection on 8001 is not one
    assert listeners(8000, tables) == [("0.0.0.0", 998)]
    assert listeners(8002, tables) == [("10.0.1.5", 7)]
    assert listeners(8003, tables) == [("::1", 1002)]
    assert listeners(9, tables) == []
    assert listeners(8001, (tables[0].parent / "missing",)) is None  # no /proc: nobody can tell


def test_the_address_must_be_a_local_listener_of_this_user(tables: tuple[Path, Path]) -> None:
    me = os.geteuid()
    assert operator_problem("127.0.0.1:9", tables) is not None
    assert "nothing on this machine listens on 127.0.0.1:9" in str(operator_problem("127.0.0.1:9", tables))
    # 10.0.1.5:8002 listens here, but the operator names another address on that port
    assert "nothing on this machine listens" in str(operator_problem("10.0.1.6:8002", tables))
    for address, uid in (("127.0.0.1:8001", 1001), ("10.0.1.5:8000", 998), ("[::1]:8003", 1002)):
        problem = operator_problem(address, tables)
        if uid == me:
            assert problem is None
        else:
            assert problem is not None
            assert "runs as " in problem
            assert "writes the run directory" in problem
    assert operator_problem("127.0.0.1:8001", (tables[0].parent / "missing",)) is None


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_the_real_kernel_table_names_this_process_as_the_listener(listening: int) -> None:
    found = listeners(listening)
    assert found is not None
    assert ("127.0.0.1", os.geteuid()) in found
    assert operator_problem(f"127.0.0.1:{listening}") is None
    assert operator_problem(f"localhost:{listening}") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a listener as another user needs root")
def test_a_superlink_of_another_user_is_refused_naming_that_user() -> None:
    nobody = pwd.getpwnam("nobody")
    port = free_port()
    code = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"
    other = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={nobody.pw_uid}",
            f"--regid={nobody.pw_gid}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        start_new_session=True,
        cwd="/",
    )
    try:
        for _ in range(100):
            if listeners(port):
                break
            time.sleep(0.1)
        assert listeners(port) == [("127.0.0.1", nobody.pw_uid)]
        problem = operator_problem(f"127.0.0.1:{port}")
        assert problem is not None
        assert "runs as nobody" in problem
        assert "sudo -u nobody gastric-fl train" in problem
    finally:
        os.killpg(other.pid, 9)
        other.wait()


def test_train_from_elsewhere_is_refused_before_submitting(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "run"
    result = subprocess.run(
        [
            str(GASTRIC_FL),
            "train",
            "--engine",
            "flower",
            "--superlink",
            f"127.0.0.1:{port}",
            "--out",
            str(out),
            "--set",
            "flower.hospitals=2",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert f"nothing on this machine listens on 127.0.0.1:{port}" in errors[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()
