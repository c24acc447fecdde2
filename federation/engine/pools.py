"""How messages reach hospitals on one machine: the transports of ``federation.server.pool.Pool``. The round loop
(``federation.server.loop``) is the same for all of them.

A pool sends ``federation.wire.contract`` messages to hospitals and returns their replies, keyed by client index:

* ``InProcessPool``: the hospitals live in this process and answer one after another (the default; on the
  shared 2-core machine, sequential clients with one torch thread matched worker processes per round without
  their start-up cost, ``benchmarks/results/round_time.md``);
* ``WorkerPool``: the hospitals are spread over worker processes (``run.workers = W``); envelopes travel as
  bytes (``codec.to_bytes``: JSON header + safetensors, never a pickle);
* ``federation.flower.apps.FlowerPool``: each hospital is a Flower SuperNode (simulated or deployed).

Every message crosses as a ``codec`` envelope, in every pool, and every envelope is shown to the pool's
``observers`` on its way (``"to_hospital"`` / ``"from_hospital"``): the boundary audit test records them.
``on_answer``, when set, is called with a client index as soon as that hospital has answered (in-process: one by
one; worker processes: per worker), so the loop can report progress within a round (``federation.progress``).
A reply's head of the hospital's outbound log (``federation.wire.chain.HEAD_FIELD``) is checked before the
reply is read (a malformed one makes the reply a ``Failure``) and, when ``anchors`` is set, kept there
(``federation.server.audit.Anchors``: ``<run>/anchors.json``).
A hospital that fails, or that a transport cannot reach, comes back as a ``Failure``; the loop decides.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from federation.errors import FederationError
from federation.hospital.handler import Hospital, Site
from federation.server.pool import Observer, Pool
from federation.wire.codec import Envelope, from_bytes, to_bytes
from infra.processes import plain_main


def answer(hospital: Hospital, envelope: Envelope) -> Envelope:
    """A hospital's side of one exchange, in whatever process it lives (recorded in its outbound log before it
    leaves: ``Hospital.answer``)."""
    return hospital.answer(envelope)


class InProcessPool(Pool):
    """Hospitals in this process, answering one after another."""

    def __init__(self, sites: Sequence[Site], observers: Sequence[Observer] = ()) -> None:
        super().__init__(observers)
        self.hospitals = {s.hospital: Hospital(s) for s in sites}

    def _broadcast(self, envelope: Envelope) -> dict[int, Envelope]:
        return {c: answer(h, envelope) for c, h in self.hospitals.items()}

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        out: dict[int, Envelope] = {}
        for c, e in envelopes.items():
            if c in self.hospitals:
                out[c] = answer(self.hospitals[c], e)
                self._answered(c)
        return out


# -- worker processes --------------------------------------------------------------------------------------------------
def _batch(envelopes: Mapping[int, Envelope], **extra: Any) -> bytes:
    """Several envelopes as one byte string (tensor names prefixed by the client), so each worker gets one send."""
    items = []
    tensors: dict[str, torch.Tensor] = {}
    for c, (header, named) in envelopes.items():
        items.append({"client": c, "header": header})
        tensors.update({f"{c}/{k}": v for k, v in named.items()})
    return to_bytes(({"items": items, **extra}, tensors))


def _unbatch(data: bytes) -> tuple[dict[str, Any], dict[int, Envelope]]:
    header, tensors = from_bytes(data)
    out: dict[int, Envelope] = {}
    for item in header.pop("items"):
        c = int(item["client"])
        prefix = f"{c}/"
        out[c] = (item["header"], {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
    return header, out


def _worker_main(conn: multiprocessing.connection.Connection, sites: list[dict[str, Any]], threads: int) -> None:
    """A worker process: hosts some hospitals and answers batches of envelopes until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and then stops us
    torch.set_num_threads(threads)
    hospitals = {int(s["client"]): Hospital(Site(Path(s["dataset"]), int(s["client"]), Path(s["root"]))) for s in sites}
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        try:
            header, envelopes = _unbatch(data)
            if header.get("op") == "stop":
                return
            replies = {c: answer(hospitals[c], e) for c, e in envelopes.items()}
            conn.send_bytes(_batch(replies, ok=True))
        except Exception as exc:
            conn.send_bytes(_batch({}, ok=False, error=str(exc), traceback=traceback.format_exc()))


class WorkerPool(Pool):
    """Hospitals spread round-robin over ``workers`` processes (forked from a fresh forkserver, ``threads`` each)."""

    def __init__(self, sites: Sequence[Site], workers: int, threads: int, observers: Sequence[Observer] = ()) -> None:
        super().__init__(observers)
        workers = max(1, min(workers, len(sites)))
        threads = threads or max(1, (os.cpu_count() or 1) // workers)
        # forkserver: one fresh server process imports torch and this module once, then forks each worker from
        # it; cheaper than spawn (one import per worker) and, unlike fork, never copies a process whose torch
        # thread pools are already running.
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["federation.engine.pools"])
        self.conns: list[multiprocessing.connection.Connection] = []
        self.processes: list[Any] = []
        self.owner: dict[int, int] = {}
        groups: list[list[dict[str, Any]]] = [[] for _ in range(workers)]
        for i, site in enumerate(sites):
            groups[i % workers].append({"client": site.hospital, "dataset": str(site.dataset), "root": str(site.root)})
            self.owner[site.hospital] = i % workers
        for w, group in enumerate(groups):
            parent, child = context.Pipe()
            process = context.Process(
                target=_worker_main, args=(child, group, threads), daemon=True, name=f"fl-worker-{w}"
            )
            with plain_main():
                process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)

    def _exchange_bytes(self, per_worker: dict[int, dict[int, Envelope]]) -> dict[int, Envelope]:
        for w, envelopes in per_worker.items():
            self.conns[w].send_bytes(_batch(envelopes, op="handle"))
        out: dict[int, Envelope] = {}
        for w in per_worker:
            try:
                header, replies = _unbatch(self.conns[w].recv_bytes())
            except EOFError as exc:
                raise FederationError(f"worker process {w} died: see its output above") from exc
            if not header.get("ok"):
                raise RuntimeError(f"worker {w} failed: {header.get('error')}\n{header.get('traceback', '')}")
            out.update(replies)
            for c in replies:
                self._answered(c)
        return out

    def _broadcast(self, envelope: Envelope) -> dict[int, Envelope]:
        return self._send(dict.fromkeys(self.owner, envelope))

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        per_worker: dict[int, dict[int, Envelope]] = {}
        for c, envelope in envelopes.items():
            if c in self.owner:
                per_worker.setdefault(self.owner[c], {})[c] = envelope
        return self._exchange_bytes(per_worker)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send_bytes(_batch({}, op="stop"))
            except (BrokenPipeError, OSError):
                continue
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for conn in self.conns:
            conn.close()
