"""The hospital boundary (DESIGN.md): only shared tensors, counts and finite scalars leave a hospital, and the
server's part of a run directory holds no head tensor, tile path, label or per-tile probability.

Every message of a run is recorded (``run.audit``: ``messages.jsonl``) and checked against the rule; then every
file the server wrote is searched for what must stay at the hospitals. The same checks run on the Flower engines
in ``test_flower_engines.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open
from support.tiny_dataset import TINY_SETTINGS

from federation.config import load_config
from federation.engine.audit import AUDIT_FILE, check_message
from federation.engine.hospital import HOSPITALS_DIR
from federation.launch import train
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
    assert not any(p.name == "predictions.csv" for p in files)
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


@pytest.mark.parametrize(("strategy", "nhead"), [("fedsaf", 6), ("fedrep", 1)])
def test_only_shared_tensors_and_scalars_cross_the_boundary(
    dataset: Path, tmp_path: Path, strategy: str, nhead: int
) -> None:
    run_dir = tmp_path / strategy
    config = load_config(
        None,
        [*TINY_SETTINGS, "run.rounds=2", f"strategy.name={strategy}", f"strategy.nhead={nhead}", "run.audit=true"],
        data=dataset,
    )
    train(config, run_dir, progress=False)
    found = assert_boundary_held(run_dir, dataset, nhead)
    assert found["uploaded"]  # the shared part did travel
    # and what stayed at each hospital is there: its head in its checkpoints, its predictions
    for c in (0, 1, 2):
        folder = run_dir / HOSPITALS_DIR / f"client_{c:02d}"
        assert (folder / "predictions.csv").is_file()
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            assert "classifier.3.weight" in set(handle.keys())


def test_a_leaking_reply_is_caught(dataset: Path) -> None:
    # the rule itself can fail: a head tensor, a path in the header, a non-finite metric
    line = {
        "tensors": {"shared/classifier.3.weight": {"finite": True}, "shared/features.0.0.weight": {"finite": False}},
        "header": {"kind": "train_reply", "metrics": {"train_loss": float("inf")}, "test_paths": ["a.png"]},
    }
    problems = check_message(line, ["features.0.0.weight"])
    assert "tensor shared/classifier.3.weight is not a shared key" in problems
    assert "tensor shared/features.0.0.weight is not finite" in problems
    assert "header field test_paths may not leave a hospital" in problems
    assert any("inf" in p for p in problems)
