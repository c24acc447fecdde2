"""The tissue description (`models.shift`, issue 47) stays at its hospital: written in the hospital's folder only,
never in a message, never in the server's part of the run; the message rule refuses it if a reply carried it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from safetensors import safe_open
from support.boundary import server_files
from support.tiny_dataset import TINY_SETTINGS

from federation.config import load_config
from federation.launch import train
from federation.runfiles import HOSPITALS_DIR
from federation.server.audit import AUDIT_FILE, REPLY_FIELDS, check_message
from federation.wire import contract
from models.names import TISSUE_FILE
from models.shift import read_description


def test_the_description_never_leaves_the_hospital(dataset: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = load_config(None, [*TINY_SETTINGS, "run.rounds=2", "run.audit=true"], data=dataset)
    train(config, run_dir, progress=False)
    # hospital 0 (10 training tiles) has one, in its own folder; hospitals 1 and 2 (7 and 5 tiles) are too small
    folder = run_dir / HOSPITALS_DIR / "client_00"
    description = read_description(folder)
    assert description is not None
    assert [p.parent.name for p in run_dir.rglob(TISSUE_FILE)] == ["client_00"]
    # no message carried it: every tensor of every message is a shared or centre tensor, no header names it
    lines = [json.loads(x) for x in (run_dir / AUDIT_FILE).read_text().splitlines()]
    assert lines
    for line in lines:
        assert all(name.split("/", 1)[0] in ("shared", "centre", "second_moment") for name in line["tensors"]), line
        assert "tissue" not in json.dumps(line["header"])
    for record in (folder / "outbound.jsonl").read_text().splitlines():
        assert "tissue" not in record
        assert "precision" not in record
    # nor the server's part of the run: no such file, no such tensor, no digit string of its threshold
    threshold_text = repr(description.threshold)
    for path in server_files(run_dir):
        assert path.name != TISSUE_FILE
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as handle:
                assert not {"mean", "precision"} & set(handle.keys())
            continue
        text = path.read_text(encoding="utf-8")
        assert TISSUE_FILE not in text, path
        assert threshold_text not in text, path
    # the contract has no field for it and the reply rule does not allow one
    messages = [cls for cls in vars(contract).values() if isinstance(cls, type) and dataclasses.is_dataclass(cls)]
    assert len(messages) > 5
    fields = {f.name for cls in messages for f in dataclasses.fields(cls)}
    assert not [f for f in fields | REPLY_FIELDS if "tissue" in f or "description" in f]


def test_a_reply_carrying_the_description_is_refused_by_the_message_rule() -> None:
    line = {
        "tensors": {"tissue/mean": {"finite": True}, "tissue/precision": {"finite": True}},
        "header": {"kind": "train_reply", "tissue": {"threshold": 50.0}},
    }
    problems = check_message(line, ["features.0.0.weight"])
    assert "header field tissue may not leave a hospital" in problems
    assert any("tissue/mean" in p for p in problems)


def test_an_export_without_a_describable_model_leaves_no_stale_description(tmp_path: Path) -> None:
    import numpy as np
    from torch import nn

    from federation.hospital.data import HospitalData
    from federation.hospital.tissue import describe_tissue
    from models.bundle import tissue_state

    rng = np.random.default_rng(0)
    tiles = rng.integers(0, 255, (12, 32, 32, 3), dtype=np.uint8)
    data = HospitalData(0, tiles, np.zeros(12, np.int64), tiles[:2], np.zeros(2, np.int64), ["a", "b"], False)
    (tmp_path / TISSUE_FILE).write_bytes(b"a description of other weights")
    # an architecture without layer units (nn.Sequential): no description, and the old file is gone
    assert describe_tissue(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()), data, tmp_path, 3) is None
    assert not (tmp_path / TISSUE_FILE).exists()
    # MobileNetV3-Small on the same 12 tiles (no slide names: a tile is its own group) is described
    from models import create_model

    assert describe_tissue(create_model("mobilenet_v3_small"), data, tmp_path, 3) == tmp_path / TISSUE_FILE
    description = read_description(tmp_path)
    assert description is not None
    assert (description.tiles, description.slides, description.round) == (12, 12, 3)
    from models.bundle import ModelCard
    from models.preprocess import Preprocess

    card = ModelCard("mobilenet_v3_small", 2, ("normal", "abnormal"), 0, (), Preprocess(32), None, round=4)
    found, note = tissue_state(tmp_path, card)
    assert found is None
    assert "describes round 3, the weights are of round 4" in note
