"""Echo app for the deployment tests: one QUERY to every SuperNode, whose reply is its ``node_config``.

To a hospital it is foreign code: its ClientApp writes a canary file first, so a test can show it never ran there.

Flower 1.41 Message API (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``). The ServerApp waits until
``num-nodes`` SuperNodes are connected, sends each one QUERY through ``grid.send_and_receive`` with a timeout
(Flower's default message TTL is 12 h), and writes ``{"replies": [...], "errors": [...]}`` as JSON to ``out-file``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Query every connected node once and write the replies to ``run_config["out-file"]``."""
    cfg = context.run_config
    out, expected = Path(str(cfg["out-file"])), int(cfg["num-nodes"])
    deadline = time.monotonic() + float(cfg["connect-timeout"])
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < expected and time.monotonic() < deadline:
        time.sleep(0.5)
        node_ids = list(grid.get_node_ids())
    messages = [
        Message(RecordDict({"ask": ConfigRecord({"hello": 1})}), dst_node_id=node, message_type=MessageType.QUERY)
        for node in node_ids
    ]
    replies, errors = [], []
    for reply in grid.send_and_receive(messages, timeout=float(cfg["reply-timeout"])):
        if reply.has_error():
            errors.append(f"{reply.metadata.src_node_id}: {reply.error.reason}")
            continue
        answer = dict(reply.content.config_records["node"])
        replies.append({"node-id": reply.metadata.src_node_id, "node-config": answer})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"connected": len(node_ids), "replies": replies, "errors": errors}, sort_keys=True))


@client.query()
def query(msg: Message, context: Context) -> Message:
    """Answer with this SuperNode's ``node_config`` (``flower-supernode --node-config``); first write the canary
    file the run names: if this code ever runs at a hospital, the file exists."""
    canary = str(context.run_config.get("canary", ""))
    if canary:
        Path(canary).write_text(f"foreign code ran at node {context.node_id}", encoding="utf-8")
    return Message(RecordDict({"node": ConfigRecord(dict(context.node_config))}), reply_to=msg)
