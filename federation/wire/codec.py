"""The one wire form of every message that crosses the hospital boundary: a JSON header plus named tensors.

``encode`` turns a ``federation.wire.contract`` message into an ``Envelope`` (header, tensors) and ``decode`` turns it
back. Every transport carries envelopes: the in-process pool hands them over as they are, worker processes send
``to_bytes`` (8-byte header length, JSON header, safetensors body; never a pickle) and the Flower apps put those
same bytes in one ``ConfigRecord`` (``federation.flower.apps``). Because every
message passes through ``encode``, a test that records envelopes sees exactly what a hospital sends and receives.

Tensor names say what they are: ``shared/<state_dict key>`` (weights the hospital loads or uploads) and
``centre/<key>`` (a proximal centre that differs from the shared weights; when it *is* the shared weights the
header says so and it travels once) and ``second_moment/<key>`` (Adam's ``v_hat`` of a shared parameter, paper 004).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from federation.errors import FederationError
from federation.runs import finite_or_none
from federation.wire.contract import (
    EvaluateReply,
    EvaluateTask,
    Failure,
    Hello,
    HelloReply,
    Recipe,
    TensorDict,
    TrainInstruction,
    TrainReply,
    TrainTask,
)

Envelope = tuple[dict[str, Any], dict[str, torch.Tensor]]
Message = Hello | HelloReply | TrainTask | TrainReply | EvaluateTask | EvaluateReply | Failure

SHARED = "shared/"
CENTRE = "centre/"
SECOND_MOMENT = "second_moment/"


def _prefixed(prefix: str, tensors: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    return {f"{prefix}{k}": v for k, v in (tensors or {}).items()}


def _unprefixed(prefix: str, tensors: Mapping[str, torch.Tensor]) -> TensorDict:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def encode(message: Message) -> Envelope:
    """``message`` as (JSON-able header, named tensors)."""
    if isinstance(message, Hello):
        return {"kind": "hello", **asdict(message)}, {}
    if isinstance(message, HelloReply):
        return {"kind": "hello_reply", **asdict(message), "classes": list(message.classes)}, {}
    if isinstance(message, TrainTask):
        instruction = message.instruction
        centre = instruction.centre
        centre_is_shared = instruction.centre_is_shared
        header = {
            "kind": "train",
            "run_id": message.run_id,
            "round": message.server_round,
            "seed": message.seed,
            "client": instruction.client,
            "shared_keys": list(message.shared_keys),
            "recipe": asdict(instruction.recipe),
            "has_shared": instruction.shared is not None,
            "has_centre": centre is not None,
            "centre_is_shared": centre_is_shared,
            "evaluate": message.evaluate,
        }
        if message.evaluate_previous:  # written only when set: other envelopes are as they always were
            header["evaluate_previous"] = True
        tensors = _prefixed(SHARED, instruction.shared)
        if centre is not None and not centre_is_shared:
            tensors.update(_prefixed(CENTRE, centre))
        return header, tensors
    if isinstance(message, TrainReply):
        header = {
            "kind": "train_reply",
            "client": message.client,
            "num_examples": message.num_examples,
            "metrics": {k: finite_or_none(v) for k, v in message.metrics.items()},  # JSON: no NaN
            "seconds": message.seconds,
            "evaluation": None if message.evaluation is None else _evaluation_header(message.evaluation),
        }
        if message.previous is not None:
            header["previous"] = _evaluation_header(message.previous)
        return header, {**_prefixed(SHARED, message.shared), **_prefixed(SECOND_MOMENT, message.second_moments)}
    if isinstance(message, EvaluateTask):
        header = {
            "kind": "evaluate",
            "run_id": message.run_id,
            "round": message.server_round,
            "client": message.client,
            "shared_keys": list(message.shared_keys),
            "has_shared": message.shared is not None,
        }
        return header, _prefixed(SHARED, message.shared)
    if isinstance(message, EvaluateReply):
        return {"kind": "evaluate_reply", **_evaluation_header(message)}, {}
    if isinstance(message, Failure):
        header = {"kind": "failure", "client": message.client, "reason": message.reason, "silent": message.silent}
        if message.diverged:  # written only when set: other failures' envelopes are as they always were
            header["diverged"] = True
        return header, {}
    raise TypeError(f"not a boundary message: {type(message).__name__}")


def _evaluation_header(reply: EvaluateReply) -> dict[str, Any]:
    return {
        "client": reply.client,
        "num_examples": reply.num_examples,
        "metrics": {k: finite_or_none(v) for k, v in reply.metrics.items()},
        "seconds": reply.seconds,
    }


def _evaluation(header: Mapping[str, Any]) -> EvaluateReply:
    return EvaluateReply(
        int(header["client"]),
        int(header["num_examples"]),
        {k: None if v is None else float(v) for k, v in header["metrics"].items()},
        float(header["seconds"]),
    )


def decode(envelope: Envelope) -> Message:
    """Inverse of ``encode``; a malformed envelope is a ``FederationError`` naming what is wrong."""
    header, tensors = envelope
    kind = header.get("kind")
    try:
        if kind == "hello":
            return Hello(str(header["run_id"]), str(header["config_toml"]), bool(header["resume"]))
        if kind == "hello_reply":
            classes = header.get("classes", list(HelloReply.classes))  # a hospital of an older version: binary
            if not isinstance(classes, list):
                raise TypeError(f"classes is {type(classes).__name__}, not a list")
            return HelloReply(
                int(header["client"]), int(header["num_train"]), int(header["num_test"]), tuple(map(str, classes))
            )
        if kind == "train":
            shared = _unprefixed(SHARED, tensors) if header["has_shared"] else None
            centre_is_shared = bool(header["has_centre"]) and bool(header["centre_is_shared"])
            centre: TensorDict | None = None
            if header["has_centre"] and not centre_is_shared:
                centre = _unprefixed(CENTRE, tensors)
            instruction = TrainInstruction(
                client=int(header["client"]),
                recipe=Recipe(**header["recipe"]),
                shared=shared,
                prox_centre=centre,
                centre_is_shared=centre_is_shared,
            )
            return TrainTask(
                str(header["run_id"]),
                int(header["round"]),
                int(header["seed"]),
                list(header["shared_keys"]),
                instruction,
                bool(header.get("evaluate", False)),
                header.get("evaluate_previous", False) is True,
            )
        if kind == "train_reply":
            metrics = {k: float("nan") if v is None else float(v) for k, v in header["metrics"].items()}
            return TrainReply(
                int(header["client"]),
                _unprefixed(SHARED, tensors),
                int(header["num_examples"]),
                metrics,
                float(header["seconds"]),
                _unprefixed(SECOND_MOMENT, tensors),
                None if header.get("evaluation") is None else _evaluation(header["evaluation"]),
                None if header.get("previous") is None else _evaluation(header["previous"]),
            )
        if kind == "evaluate":
            return EvaluateTask(
                str(header["run_id"]),
                int(header["round"]),
                int(header["client"]),
                list(header["shared_keys"]),
                _unprefixed(SHARED, tensors) if header["has_shared"] else None,
            )
        if kind == "evaluate_reply":
            return _evaluation(header)
        if kind == "failure":
            return Failure(
                int(header["client"]),
                str(header["reason"]),
                bool(header.get("silent", False)),
                header.get("diverged", False) is True,
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise FederationError(f"malformed {kind!r} message: {exc!r}") from exc
    raise FederationError(f"unknown message kind {kind!r}")


def to_bytes(envelope: Envelope) -> bytes:
    """One envelope as bytes: 8-byte header length, JSON header, safetensors body (no pickle)."""
    header, tensors = envelope
    head = json.dumps(header, allow_nan=False).encode("utf-8")
    body = st_save(_unshared(tensors)) if tensors else b""
    return len(head).to_bytes(8, "little") + head + body


def envelope_digest(envelope: Envelope) -> str:
    """sha256 of one envelope in a canonical form (header keys sorted, then the safetensors body): the same on both
    sides of any transport, so a hospital's record of what it sent (``federation.hospital.outbound``) can be matched
    with what the server received (``run.audit``'s ``messages.jsonl``)."""
    header, tensors = envelope
    digest = hashlib.sha256(json.dumps(header, allow_nan=False, sort_keys=True).encode("utf-8"))
    if tensors:
        digest.update(st_save(_unshared(dict(sorted(tensors.items())))))
    return digest.hexdigest()


def _unshared(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous tensors that share no memory (safetensors refuses aliases; one dict sent to several
    hospitals in one batch is such an alias)."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        value = value.detach().cpu().contiguous()
        if value.untyped_storage().data_ptr() in seen:
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        out[key] = value
    return out


def from_bytes(data: bytes) -> Envelope:
    """Inverse of ``to_bytes``."""
    size = int.from_bytes(data[:8], "little")
    header: dict[str, Any] = json.loads(data[8 : 8 + size].decode("utf-8"))
    body = data[8 + size :]
    return header, (dict(st_load(body)) if body else {})
