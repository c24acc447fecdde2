"""BatchNorm kept at the hospital (``strategy.bn = "local"`` or ``"local_stats"``).

Two-phase recipes (FedRep, FedSAF Eq. 24-25): a local BatchNorm layer of the base belongs to its layer unit: it
stays frozen (eval mode, affine parameters and statistics untouched) while the head trains, and trains with the
base (train mode: batch statistics, affine parameters updated) while the base trains. Frozen in the base phase,
the base's convolutions trained without any normalisation and diverged (weights ~1e22 after one round, NaN Fisher
traces) on the stain-shift regime.

Evaluation of received weights (FedAvg and the other averaging methods): the statistics a hospital keeps are
recomputed (precise BN) for the weights it evaluates, not left as those of its weights before averaging.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.checks import every
from support.tiny_dataset import TINY_SETTINGS, make_dataset
from torch import nn

from federation.config import load_config
from federation.derived import initial_state
from federation.hospital.data import HospitalData, load_hospitals
from federation.hospital.trainer import Trainer
from federation.launch import train
from federation.wire.contract import Recipe, TrainInstruction
from models import base_keys, batchnorm_keys, create_model, head_keys, split_units

NHEAD = 3  # features.12 (convolution + BatchNorm), classifier.0 and classifier.3; the base has BatchNorm too


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("localbn"))


@pytest.fixture(scope="module")
def tiles(dataset: Path) -> dict[int, HospitalData]:
    return load_hospitals(dataset, input_size=32)


def _local_bn_client(data: HospitalData) -> Trainer:
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small")
    units = split_units(model)
    local = set(batchnorm_keys(model, affine=True))
    shared = [k for k in base_keys(units, NHEAD) if k not in local]
    return Trainer(
        data, model, shared, batch_size=4, eval_batch_size=8, augment=False, head_keys=head_keys(units, NHEAD)
    )


def test_base_batchnorm_is_frozen_in_the_head_phase_and_trains_in_the_base_phase(
    tiles: dict[int, HospitalData],
) -> None:
    client = _local_bn_client(tiles[0])
    base_bn = client.model.get_submodule("features.3.block.0.1")  # a local BatchNorm of the base
    head_bn = client.model.get_submodule("features.12.1")  # a BatchNorm of the head
    head_weight = client.model.get_parameter("classifier.3.weight")  # trainable only in the head phase
    assert isinstance(base_bn, nn.BatchNorm2d)
    assert isinstance(head_bn, nn.BatchNorm2d)
    seen: dict[str, set[tuple[bool, bool, bool]]] = {"head": set(), "base": set()}

    def record(_module: nn.Module, _inputs: object) -> None:
        if torch.is_grad_enabled():  # a training step, not precise BN or the Fisher pass
            phase = "head" if head_weight.requires_grad else "base"
            seen[phase].add((base_bn.training, base_bn.weight.requires_grad, head_bn.training))

    base_bn.register_forward_pre_hook(record)
    recipe = Recipe(epochs=1, head_epochs=1, lr=0.01, momentum=0.9, precise_bn=False)
    client.train(TrainInstruction(0, recipe), server_round=1, seed=0)
    # (base BatchNorm in train mode, its affine parameters trained, head BatchNorm in train mode)
    assert seen == {"head": {(False, False, True)}, "base": {(True, True, False)}}


def test_head_phase_leaves_every_base_tensor_alone(tiles: dict[int, HospitalData]) -> None:
    client = _local_bn_client(tiles[0])
    units = split_units(client.model)
    before = client.state()
    recipe = Recipe(epochs=0, head_epochs=1, lr=0.05, momentum=0.9, precise_bn=False)
    client.train(TrainInstruction(0, recipe), server_round=1, seed=0)
    after = client.state()
    changed = [k for k in base_keys(units, NHEAD) if not torch.equal(before[k], after[k])]
    assert changed == []
    assert any(not torch.equal(before[k], after[k]) for k in head_keys(units, NHEAD))


def test_a_hospital_keeps_its_local_base_batchnorm_frozen_while_the_head_trains(dataset: Path, tmp_path: Path) -> None:
    """The engine's hospitals know their head: with base epochs off, FedRep with bn = local changes no base tensor."""
    settings = [*TINY_SETTINGS, "run.rounds=1", "strategy.name=fedrep", "strategy.bn=local", "client.epochs=0"]
    config = load_config(None, [*settings, "client.precise_bn=false", "client.head_epochs=1"], data=dataset)
    train(config, tmp_path / "run", progress=False)
    initial, units = initial_state(config)
    local = set(batchnorm_keys(create_model("mobilenet_v3_small"), affine=True))
    for c in (0, 1):
        state = load_file(str(tmp_path / "run" / "hospitals" / f"client_{c:02d}" / "model.safetensors"))
        base = base_keys(units, 1)
        assert base
        # BatchNorm never travels: bit for bit the initial one; the rest is the average of unchanged uploads
        assert [k for k in base if k in local and not torch.equal(state[k], initial[k])] == []
        for key in base:
            torch.testing.assert_close(state[key], initial[key], rtol=0, atol=1e-6)
        assert not torch.equal(state["classifier.3.weight"], initial["classifier.3.weight"])


def test_recompute_batchnorm_keeps_the_statistics_it_is_told_to(tiles: dict[int, HospitalData]) -> None:
    client = _local_bn_client(tiles[0])
    stats = [k for k in client.model.state_dict() if k.endswith(("running_mean", "running_var"))]
    first = {k for k in stats if k.startswith("features.0.")}
    before = client.state()
    client.recompute_batchnorm(keep=first)
    after = client.state()
    assert every(torch.equal(before[k], after[k]) for k in first)
    assert every(not torch.equal(before[k], after[k]) for k in stats if k not in first)
    client.recompute_batchnorm(keep=stats)  # every statistic kept: nothing to recompute
    assert every(torch.equal(after[k], v) for k, v in client.state().items())


@pytest.mark.parametrize("bn", ["local_stats", "local"])
def test_a_hospital_evaluates_received_weights_with_its_statistics_for_those_weights(
    dataset: Path, tmp_path: Path, tiles: dict[int, HospitalData], bn: str
) -> None:
    """FedAvg: a hospital evaluates (and exports) the averaged weights with its own BatchNorm statistics, recomputed
    for those weights, not the ones it computed for its own weights before averaging."""
    config = load_config(
        None, [*TINY_SETTINGS, "run.rounds=1", "strategy.name=fedavg", f"strategy.bn={bn}"], data=dataset
    )
    train(config, tmp_path / "run", progress=False)
    for c in (0, 1):
        exported = load_file(str(tmp_path / "run" / "hospitals" / f"client_{c:02d}" / "model.safetensors"))
        model = create_model("mobilenet_v3_small")
        model.load_state_dict(exported)
        client = Trainer(tiles[c], model, [], batch_size=4, eval_batch_size=config.data.eval_batch_size, augment=False)
        client.recompute_batchnorm()
        state = client.state()
        assert state
        # Recomputed here in another thread layout than in the run: float sums in another order, so a deep layer's
        # variance differs by up to 1.7e-4 relative on an Intel Xeon (1e-4 held on AMD EPYC); stale statistics, the
        # ones computed for the hospital's own weights before averaging, differ by orders of magnitude more.
        for key, value in state.items():
            torch.testing.assert_close(
                value, exported[key], rtol=1e-3, atol=1e-4, msg=lambda m, c=c, key=key: f"hospital {c}: {key}: {m}"
            )
