"""The hospital boundary's checks on a finished run (docs/design.md): only shared tensors, counts and finite scalars
left a hospital, and the server's part of the run holds no head tensor, tile path, label or per-tile probability.
Used by the in-process boundary tests (tests/federation/engine/test_boundary.py) and the Flower engines' tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import safe_open

from federation.runfiles import HOSPITALS_DIR, PREDICTIONS_FILE
from federation.server.audit import AUDIT_FILE, check_message
from models import create_model, head_keys, split_units


def tile_paths_and_names(dataset: Path) -> list[str]:
    """What identifies a hospital's tiles: every manifest path and file name."""
    lines = (dataset / "manifest.csv").read_text().splitlines()[1:]
    paths = [line.split(",")[3] for line in lines]
    return paths + [p.rsplit("/", 1)[-1] for p in paths]


def server_files(run_dir: Path) -> list[Path]:
    """Everything in the run directory except the hospitals' own folders."""
    return [p for p in run_dir.rglob("*") if p.is_file() and HOSPITALS_DIR not in p.relative_to(run_dir).parts]


def assert_boundary_held(run_dir: Path, dataset: Path, nhead: int) -> dict[str, Any]:
    """The checks of the module docstring on one finished run; returns counts for further assertions."""
    units = split_units(create_model("mobilenet_v3_small"))
    head = set(head_keys(units, nhead))
    all_keys = set(create_model("mobilenet_v3_small").state_dict())
    shared = sorted(all_keys - head)
    lines = [json.loads(x) for x in (run_dir / AUDIT_FILE).read_text().splitlines()]
    replies = [x for x in lines if x["direction"] == "from_hospital"]
    sent = [x for x in lines if x["direction"] == "to_hospital"]
    assert replies, "no message was recorded"
    for line in replies:
        assert check_message(line, shared) == [], line["kind"]
    uploaded = {name.removeprefix("shared/") for x in replies for name in x["tensors"]}
    downloaded = {name.split("/", 1)[1] for x in sent for name in x["tensors"]}
    assert not uploaded & head
    assert not downloaded & head
    # the server's part: no head tensor in its checkpoints, no tile path, no label column, no probabilities
    secrets = tile_paths_and_names(dataset)
    files = server_files(run_dir)
    assert not any(p.name == PREDICTIONS_FILE for p in files)
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as handle:
                keys = list(handle.keys())
            assert not [k for k in keys if k.split("/", 1)[-1].removeprefix("shared.") in head]
            assert not [k for k in keys if any(h in k for h in head)]
            continue
        text = path.read_text(encoding="utf-8")
        assert not [s for s in secrets if s in text], path
        assert "prob_abnormal" not in text
        assert '"label"' not in text
    return {"uploaded": uploaded, "replies": replies}
