"""A warm hospital (kept loaded between messages by its executor, federation.flower.executor) that is restarted
mid-run continues bit-identically: its folder, checkpointed after every round, is all it needs. Played at the
boundary (``Hospital.answer``, the wire codec): after an honest round 1, one copy of the hospital's folder is
answered by the same warm ``Hospital`` object, the other by a fresh one (a restarted executor, no Hello again);
round 2's replies, outbound records and exported models must be identical."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from support.checks import every
from support.trust import RUN, config_of, deployed, honest_task, send

from federation.config import config_to_toml
from federation.hospital.handler import Hospital, Site
from federation.hospital.outbound import read_outbound
from federation.hospital.policy import HospitalPolicy
from federation.wire.contract import Hello, HelloReply, TrainReply
from models.names import WEIGHTS_FILE


def test_a_restarted_hospital_answers_round_two_as_the_warm_one(dataset: Path, tmp_path: Path) -> None:
    config = config_of(dataset)
    warm = deployed(tmp_path / "warm", dataset)
    assert isinstance(send(warm, Hello(RUN, config_to_toml(config))), HelloReply)
    first = send(warm, honest_task(config, evaluate=True))
    assert isinstance(first, TrainReply)
    shutil.copytree(tmp_path / "warm", tmp_path / "restarted")
    restarted = Hospital(Site(dataset, 0, tmp_path / "restarted" / "state", per_run=True, policy=HospitalPolicy()))

    # round 2 starts from round 1's upload (as an averaging server would send it back), with a new seed
    task = honest_task(config, server_round=2, evaluate=True)
    task.instruction.shared = {k: v.clone() for k, v in first.shared.items()}
    task.seed = 11
    from_warm, from_restarted = send(warm, task), send(restarted, task)
    assert isinstance(from_warm, TrainReply)
    assert isinstance(from_restarted, TrainReply)
    assert list(from_warm.shared) == list(from_restarted.shared)
    assert from_warm.shared
    for key, value in from_warm.shared.items():
        assert torch.equal(value, from_restarted.shared[key]), key
    assert any(not torch.equal(first.shared[k], from_warm.shared[k]) for k in first.shared)  # round 2 trained
    assert from_warm.metrics == from_restarted.metrics
    assert from_warm.evaluation is not None
    assert from_restarted.evaluation is not None
    assert dataclasses.replace(from_warm.evaluation, seconds=0.0) == dataclasses.replace(
        from_restarted.evaluation, seconds=0.0
    )  # everything but the time it took
    # the exported models: the same tensors and the same metadata (whose order in the file safetensors does not fix)
    exported = [tmp_path / side / "state" / RUN / WEIGHTS_FILE for side in ("warm", "restarted")]
    warm_model, restarted_model = (load_file(str(path)) for path in exported)
    assert list(warm_model) == list(restarted_model)
    assert every(torch.equal(warm_model[k], restarted_model[k]) for k in warm_model)
    metadata = []
    for path in exported:
        with safe_open(str(path), framework="pt") as handle:
            metadata.append(handle.metadata())
    assert metadata[0] == metadata[1]
    assert metadata[0]  # round and stage are recorded
    # and each folder's own record of what left lists the same tensors for round 2
    records = [read_outbound(tmp_path / s / "state" / "outbound.jsonl").records[-1] for s in ("warm", "restarted")]
    assert records[0]["round"] == records[1]["round"] == 2
    assert records[0]["tensors"] == records[1]["tensors"]
