"""A hospital driven as the server would drive it, one message at a time (the trust tests' helpers): the run id,
a FedSAF configuration on the tiny dataset, a deployed hospital under a policy, and an honest training task."""

from __future__ import annotations

from pathlib import Path

from federation.config import RunConfig, load_config, resolve_config
from federation.derived import initial_state
from federation.hospital.handler import Hospital, Site
from federation.hospital.policy import HospitalPolicy, agreed_shared_keys
from federation.wire.codec import Message, decode, encode
from federation.wire.contract import Recipe, TrainInstruction, TrainTask
from models import create_model
from support.tiny_dataset import TINY_SETTINGS

RUN = "run-a"


def config_of(dataset: Path, *extra: str) -> RunConfig:
    return resolve_config(
        load_config(None, [*TINY_SETTINGS, "strategy.name=fedsaf", "strategy.nhead=6", *extra], data=dataset)
    )


def send(hospital: Hospital, message: Message) -> Message:
    return decode(hospital.answer(encode(message)))


def deployed(tmp_path: Path, dataset: Path, policy: HospitalPolicy | None = None) -> Hospital:
    return Hospital(Site(dataset, 0, tmp_path / "state", per_run=True, policy=policy or HospitalPolicy()))


def honest_keys(config: RunConfig) -> list[str]:
    return agreed_shared_keys(config, create_model(config.model.name, 2, config.model.in_chans))


def honest_task(config: RunConfig, server_round: int = 1, **changes: object) -> TrainTask:
    initial, _ = initial_state(config)
    keys = honest_keys(config)
    shared = {k: initial[k].clone() for k in keys}
    recipe = Recipe(epochs=1, lr=0.01, head_epochs=1)
    instruction = TrainInstruction(0, recipe, shared=shared)
    task = TrainTask(RUN, server_round, 7, keys, instruction)
    for key, value in changes.items():
        setattr(task, key, value)
    return task
