"""The boundary log: what crossed between the server and each hospital, message by message (``run.audit``).

DESIGN.md, "The hospital boundary": only shared tensors, example counts and scalar metrics leave a hospital.
With ``run.audit = true`` every envelope a pool carries (``federation.engine.pools``, Flower's included) is
described in ``<run>/messages.jsonl``: direction, kind, client, the header's scalar fields and, for each tensor,
its name, shape, dtype and whether all its values are finite; never the values themselves. A hospital's data
officer can read it to see exactly what left the site; ``check_message`` is the rule the tests apply to it.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from federation.data import CLASS_NAME
from federation.engine.codec import Envelope, envelope_digest
from federation.runfiles import AUDIT_FILE as AUDIT_FILE  # named with the run's other files

# Header fields a hospital may send: identity, counts, scalar metrics, timing, a failure's one-line reason, and
# its dataset's class names (``HelloReply.classes``: plain names only, `CLASS_NAME`).
REPLY_FIELDS = frozenset(
    {
        "kind",
        "client",
        "num_train",
        "num_test",
        "num_examples",
        "metrics",
        "seconds",
        "reason",
        "silent",
        "evaluation",
        "previous",
        "classes",
    }
)


def describe(direction: str, envelope: Envelope) -> dict[str, Any]:
    """One line of the boundary log for ``envelope`` (no tensor values)."""
    header, tensors = envelope
    return {
        "direction": direction,
        "kind": header.get("kind"),
        "client": header.get("client"),
        "sha256": envelope_digest(envelope),
        "header": {k: v for k, v in header.items() if k != "config_toml"},
        "tensors": {
            name: {
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "finite": bool(torch.isfinite(t).all()) if t.is_floating_point() else True,
            }
            for name, t in tensors.items()
        },
    }


class AuditLog:
    """An observer (``Pool.observers``) appending ``describe`` lines to ``path``; safe from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, direction: str, envelope: Envelope) -> None:
        line = json.dumps(describe(direction, envelope), allow_nan=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)


def _scalars(value: Any) -> Iterable[Any]:
    if isinstance(value, Mapping):
        for v in value.values():
            yield from _scalars(v)
    elif isinstance(value, list):
        for v in value:
            yield from _scalars(v)
    else:
        yield value


def check_message(line: Mapping[str, Any], shared_keys: Sequence[str]) -> list[str]:
    """What in a ``from_hospital`` log line breaks the boundary rule (empty when nothing does).

    Tensors: only ``shared/<key>`` (and ``second_moment/<key>``, paper 004) for a shared key, all finite.
    Header: only ``REPLY_FIELDS``, whose values are integers, finite floats, ``null`` (an undefined metric) or,
    for ``kind`` and a failure's ``reason``, text (``silent``: a boolean); ``classes`` only in a hello reply, as
    a list of plain class names (``CLASS_NAME``: letters, digits, ``.``, ``_``, ``-``; at most 64 characters).
    """
    problems: list[str] = []
    shared = set(shared_keys)
    for name, info in line["tensors"].items():
        kind, _, key = name.partition("/")
        if kind not in ("shared", "second_moment") or key not in shared:
            problems.append(f"tensor {name} is not a shared key")
        if not info["finite"]:
            problems.append(f"tensor {name} is not finite")
    header = line["header"]
    for key, value in header.items():
        if key not in REPLY_FIELDS:
            problems.append(f"header field {key} may not leave a hospital")
            continue
        if key == "silent":
            if not isinstance(value, bool):
                problems.append("silent is not true or false")
            continue
        if key == "classes":
            if (
                header.get("kind") != "hello_reply"
                or not isinstance(value, list)
                or not all(isinstance(c, str) and CLASS_NAME.match(c) for c in value)
            ):
                problems.append("classes is not a hello reply's list of plain class names")
            continue
        if key in ("kind", "reason"):
            if not isinstance(value, str) or (key == "reason" and ("\n" in value or len(value) > 500)):
                problems.append(f"{key} is not one line of text")
            continue
        for v in _scalars(value):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                problems.append(f"header field {key} holds {v!r}, not a finite number")
    return problems
