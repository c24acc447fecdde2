"""Precise BN (federation.wire.contract.Recipe.precise_bn): running statistics equal the training-set average."""

from __future__ import annotations

import pytest
import torch
from support.tiny_dataset import make_dataset
from torch import nn

from federation.hospital.data import HospitalData, load_hospitals, to_tensor
from federation.hospital.trainer import Trainer
from federation.wire.contract import Recipe, TrainInstruction
from models import base_keys, create_model, split_units


@pytest.fixture(scope="module")
def tiles(tmp_path_factory: pytest.TempPathFactory) -> dict[int, HospitalData]:
    return load_hospitals(make_dataset(tmp_path_factory.mktemp("pbn")), input_size=32)


def _client(data: HospitalData) -> Trainer:
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small")
    shared = base_keys(split_units(model), 1)
    # eval batch 4 over 10 tiles: batches of 4, 4, 2, so the cumulative average is over unequal batches
    return Trainer(data, model, shared, batch_size=16, eval_batch_size=4, augment=False)


def _first_bn_input(client: Trainer) -> tuple[nn.BatchNorm2d, list[torch.Tensor]]:
    conv, bn = client.model.features[0][0], client.model.features[0][1]  # type: ignore[index]
    with torch.no_grad():
        batches = [conv(to_tensor(client.data.train_x[s : s + 4])) for s in range(0, client.data.num_train, 4)]
    return bn, batches


def test_precise_bn_sets_running_stats_to_the_average_of_batch_statistics(tiles: dict[int, HospitalData]) -> None:
    client = _client(tiles[0])
    client.train(TrainInstruction(0, Recipe(epochs=1, lr=0.05, precise_bn=True)), server_round=1, seed=0)
    bn, batches = _first_bn_input(client)
    # momentum=None: the running mean is the plain average of the per-batch means (unbiased variances likewise)
    mean = torch.stack([b.mean(dim=(0, 2, 3)) for b in batches]).mean(0)
    var = torch.stack([b.var(dim=(0, 2, 3), unbiased=True) for b in batches]).mean(0)
    torch.testing.assert_close(bn.running_mean, mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn.running_var, var, rtol=1e-4, atol=1e-5)
    assert bn.momentum == pytest.approx(0.1)  # the layer's own momentum is restored afterwards


def test_without_precise_bn_running_stats_lag_behind(tiles: dict[int, HospitalData]) -> None:
    client = _client(tiles[0])
    client.train(TrainInstruction(0, Recipe(epochs=1, lr=0.05, precise_bn=False)), server_round=1, seed=0)
    bn, batches = _first_bn_input(client)
    mean = torch.stack([b.mean(dim=(0, 2, 3)) for b in batches]).mean(0)
    assert not torch.allclose(bn.running_mean, mean, rtol=1e-2, atol=1e-3)


def test_precise_bn_is_on_in_the_default_config() -> None:
    from federation.config import DEFAULTS_TOML

    assert "precise_bn = true" in DEFAULTS_TOML
