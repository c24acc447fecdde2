"""The server's Flower app: a ``ServerApp`` whose main loop is our engine (the hospital's ``ClientApp`` is
``federation.flower.hospital_app``; envelopes in Flower records, ``federation.flower.records``).

Flower's ``Strategy.start`` assumes one global model; FedAMP and FedSAF give every hospital its own message, so
the ``ServerApp`` main runs ``federation.server.loop.Server`` with a ``FlowerPool``: per-hospital messages through
the grid's ``push_messages``/``pull_messages`` (`exchange`: Flower's ``send_and_receive`` with a short pull
interval), every call with a timeout (Flower 1.41 Message API; docs/design.md, "Messages, strategies and engines").

* Before round 1 a QUERY message (our ``Hello``) goes to every connected node; each reply states the hospital's
  client index, which maps Flower's random node ids to hospitals.
* Each message carries one ``codec`` envelope in its wire form (``codec.to_bytes``: JSON header, safetensors
  body) in one ``ConfigRecord``, so Flower carries exactly what the other engines carry, as one object.
* The ``ClientApp`` answers with ``federation.hospital.handler.Hospital``: it reads its prepared data and its
  folder from the node configuration (``data-path``, ``client``, ``hospital-dir``) in a deployment, or from the
  simulation's partition id. Its head and checkpoints live in that folder, never in module globals: a deployed
  SuperNode starts a fresh process per message, and Ray reuses one actor for several simulated hospitals.

A hospital that does not answer within ``flower.round_timeout``, or answers with an error, comes back as a
``Failure`` and is left out of that round by the engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from flwr.app import Context, Message
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid, ServerApp

from federation.derived import config_from_text
from federation.errors import FederationError
from federation.flower.records import MESSAGE_TYPES, from_record, to_record
from federation.flower.waits import waits
from federation.server.loop import Server
from federation.server.pool import Observer, Pool
from federation.wire.codec import Envelope, encode
from federation.wire.contract import Failure


# -- the server side -------------------------------------------------------------------------------------------------
def exchange(grid: Grid, messages: Sequence[Message], timeout: float) -> list[Message]:
    """Push ``messages`` and pull their replies until every one has answered or ``timeout`` seconds have passed.

    What Flower 1.41's ``Grid.send_and_receive`` does (``flwr/superlink/grid/http_grid.py``), through the same
    public ``Grid.push_messages`` / ``pull_messages``, but with a short pull interval that grows while nothing comes
    (`federation.flower.waits`) instead of a fixed 3 s: a reply is seen within a fraction of a second of its
    arrival, and a long round costs at most two pulls a second. A message whose node went away comes back as an
    error reply, as in ``send_and_receive``.
    """
    waiting = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    delays = waits()
    wait = next(delays)
    while waiting:
        pulled = list(grid.pull_messages(waiting))
        replies.extend(pulled)
        waiting.difference_update(m.metadata.reply_to_message_id for m in pulled)
        left = deadline - time.monotonic()
        if not waiting or left <= 0:
            break
        time.sleep(min(wait, left))
        if not pulled:  # the wait grows only while nothing comes
            wait = next(delays)
    return replies


class FlowerPool(Pool):
    """Hospitals as Flower nodes reached through ``grid``; replies keyed by the client index each hospital stated."""

    def __init__(
        self,
        grid: Grid,
        *,
        hospitals: int,
        connect_timeout: float,
        round_timeout: float,
        observers: Sequence[Observer] = (),
    ) -> None:
        super().__init__(observers)
        self.grid = grid
        self.hospitals = hospitals
        self.connect_timeout = connect_timeout
        self.round_timeout = round_timeout
        self.node_of: dict[int, int] = {}

    def _nodes(self) -> list[int]:
        deadline = time.monotonic() + self.connect_timeout
        while True:
            nodes = sorted(self.grid.get_node_ids())
            if len(nodes) >= self.hospitals:
                return nodes
            if time.monotonic() > deadline:
                raise FederationError(
                    f"only {len(nodes)} of {self.hospitals} hospitals connected within {self.connect_timeout:g} s "
                    f"(connected node ids: {', '.join(map(str, nodes)) or 'none'}; which kit hospital each is: "
                    "registered.json in the server's state): start the others' SuperNodes (gastric-fl federation "
                    "hospital) or lower flower.hospitals"
                )
            time.sleep(1.0)

    def _exchange_nodes(self, envelopes: Mapping[int, Envelope], timeout: float) -> dict[int, Message]:
        # A message lives as long as the server waits for it: a hospital that comes back later must not act on a
        # round that is over (Flower's default TTL is 12 h).
        messages = [
            Message(to_record(e), dst_node_id=node, message_type=MESSAGE_TYPES[str(e[0]["kind"])], ttl=timeout)
            for node, e in envelopes.items()
        ]
        replies = exchange(self.grid, messages, timeout)
        # by the message each reply answers, not by its sender: the SuperLink answers for a node it holds
        # unavailable with an error reply of its own (sender: the SuperLink)
        node_of = {m.metadata.message_id: node for m, node in zip(messages, envelopes, strict=True)}
        return {
            node_of[r.metadata.reply_to_message_id]: r for r in replies if r.metadata.reply_to_message_id in node_of
        }

    def _reply_envelope(self, hospital: int, reply: Message) -> Envelope:
        if reply.has_error():
            reason = (reply.error.reason or "no reason given").strip().splitlines()
            last = reason[-1] if reason else ""
            if reply.metadata.src_node_id == SUPERLINK_NODE_ID:
                # the hospital never got the message (e.g. its SuperNode missed its heartbeats): probably down
                return encode(Failure(hospital, f"the SuperLink could not deliver to it: {last}", silent=True))
            return encode(Failure(hospital, f"the hospital's ClientApp failed: {last}"))
        return from_record(reply.content)

    def _broadcast(self, envelope: Envelope) -> dict[int, Envelope]:
        nodes = self._nodes()
        replies = self._exchange_nodes(dict.fromkeys(nodes, envelope), self.connect_timeout)
        out: dict[int, Envelope] = {}
        for i, node in enumerate(nodes):
            if node not in replies:
                continue  # a node that went away before answering takes no part
            # before the hello reply we cannot know the hospital: a failing node is keyed by a negative number
            reply = self._reply_envelope(-(i + 1), replies[node])
            if reply[0].get("kind") == "hello_reply":
                self.node_of[int(reply[0]["client"])] = node
            out[-(i + 1)] = reply
        return out

    def _send(self, envelopes: Mapping[int, Envelope]) -> dict[int, Envelope]:
        by_node = {self.node_of[c]: e for c, e in envelopes.items() if c in self.node_of}
        hospital_of = {node: c for c, node in self.node_of.items()}
        began = time.monotonic()
        replies = self._exchange_nodes(by_node, self.round_timeout)
        waited = time.monotonic() - began
        missing = [c for c in envelopes if self.node_of.get(c) not in replies]
        connected = set(self.grid.get_node_ids()) if missing else set()
        out: dict[int, Envelope] = {}
        for c in envelopes:
            node = self.node_of.get(c)
            if node is None or node not in replies:
                if node is not None and node not in connected:
                    reason = f"its SuperNode lost its connection to the server (offline after {waited:.0f} s)"
                else:
                    reason = f"no answer within {self.round_timeout:g} s (flower.round_timeout)"
                out[c] = encode(Failure(c, reason, silent=True))
            else:
                out[hospital_of[node]] = self._reply_envelope(c, replies[node])
        return out


def server_app() -> ServerApp:
    """The ``ServerApp``: our round loop over the grid, its run directory named by the run configuration."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        settings = context.run_config
        config = config_from_text(str(settings["config-toml"]), "the submitted run configuration")
        run_dir = Path(str(settings["run-dir"]))
        server = Server(config, run_dir, progress=False)
        server.dataset_sha256 = str(settings.get("dataset-sha256", "")) or None

        def make_pool() -> Pool:
            return FlowerPool(
                grid,
                hospitals=int(settings["hospitals"]),
                connect_timeout=config.flower.connect_timeout,
                round_timeout=config.flower.round_timeout,
            )

        server.run(make_pool, resume=bool(settings["resume"]), overwrite=bool(settings["overwrite"]))

    return app


__all__ = ["FlowerPool", "server_app"]
