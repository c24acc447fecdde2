"""Where the operator of a deployed run must be: on the server's machine, as the server's user.

The ServerApp writes the run directory (``--out``: metrics, aggregation, summary, checkpoints) on the SuperLink's
machine, as the user the SuperLink runs as; ``train --engine flower`` follows the run and returns its summary by
reading that directory, and ``report``, ``ablate`` and the dashboard read it afterwards. The Control API is
reachable only on the server machine (the gate passes the Fleet API alone, ``federation.flower.gate``). So an
operator elsewhere, or another user on that machine, would submit a run whose records it can never read, or that
the server's user cannot write where the operator asked. `operator_problem` finds this out before anything is
submitted, from the kernel's table of listening TCP sockets (``/proc/net/tcp`` and ``tcp6``, each with the uid
that opened it; proc(5)): which local user, if any, listens on the SuperLink's address in this network namespace.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
PROC_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as ``/proc/net/tcp{,6}`` writes it: the bytes of each 32-bit word in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listeners(port: int, tables: tuple[Path, ...] = PROC_TABLES) -> list[tuple[str, int]] | None:
    """``(address, uid)`` of every socket listening on TCP ``port`` in this network namespace, or ``None`` where
    the kernel's tables cannot be read (not Linux): then nobody can tell."""
    found: list[tuple[str, int]] = []
    read_any = False
    for table in tables:
        try:
            lines = table.read_text(encoding="ascii", errors="replace").splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            try:
                if int(hex_port, 16) == port:
                    found.append((str(_address(address)), int(fields[7])))
            except ValueError:
                continue
    return found if read_any else None


def _local_addresses(host: str) -> set[str]:
    """The addresses ``host`` names (an address as is; a name through the resolver, as ``flwr`` would look it up)."""
    try:
        return {str(ipaddress.ip_address(host.strip("[]")))}
    except ValueError:
        pass
    try:
        return {str(ipaddress.ip_address(info[4][0])) for info in socket.getaddrinfo(host, None)}
    except (OSError, ValueError):
        return set()


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def operator_problem(superlink: str, tables: tuple[Path, ...] = PROC_TABLES) -> str | None:
    """Why this process cannot operate the deployed run at ``superlink`` (``HOST:PORT``), or ``None`` when it can
    (or when this machine cannot tell: no ``/proc``). The SuperLink must listen here, on that address or on all
    addresses, and as this process's user (the one who writes the run directory the operator reads)."""
    host, _, port_text = superlink.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        return None  # a malformed address is flwr's to report
    found = listeners(port, tables)
    if found is None:
        return None
    wanted = _local_addresses(host)
    wildcard = {"0.0.0.0", "::"}
    owners = sorted({uid for address, uid in found if address in wanted or address in wildcard})
    if not owners:
        return (
            f"nothing on this machine listens on {superlink} (flower.superlink): the server writes the run directory "
            "(--out) on its own machine, where report and the dashboard read it; run train there, as the server's "
            "user, through the SuperLink's own address (127.0.0.1:PORT, PORT the server's --control-port)"
        )
    me = os.geteuid()
    if me not in owners:
        names = " or ".join(_user(uid) for uid in owners)
        return (
            f"the SuperLink on {superlink} runs as {names}, who writes the run directory (--out) that train "
            f"reads: run train as {names} (e.g. sudo -u {_user(owners[0])} gastric-fl train ...)"
        )
    return None
