"""A hospital's training recipes (FedSAF paper Eq. 23-25, FedRep, FedProx) and evaluation."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from support.checks import every
from support.tiny_dataset import make_dataset

from federation.errors import FederationError
from federation.hospital.data import HospitalData, load_hospitals
from federation.hospital.evaluation import auc_or_none
from federation.hospital.trainer import Trainer, proximal_term
from federation.wire.contract import Recipe, TrainInstruction
from models import base_keys, create_model, head_keys, split_units


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    # as the engine runs clients by default (run.threads = 1): steady timing on a shared machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiles(tmp_path_factory: pytest.TempPathFactory) -> dict[int, HospitalData]:
    return load_hospitals(make_dataset(tmp_path_factory.mktemp("tiny")), input_size=32)


def _client(data: HospitalData, nhead: int = 1, batch_size: int = 16, augment: bool = False) -> Trainer:
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small")
    shared = base_keys(split_units(model), nhead)
    return Trainer(data, model, shared, batch_size=batch_size, eval_batch_size=8, augment=augment)


def test_proximal_term_value_and_gradient_are_exact() -> None:
    w = torch.tensor([1.0, 2.0, -1.0], requires_grad=True)
    centre = torch.tensor([0.5, 2.5, 1.0])
    term = proximal_term({"w": w}, {"w": centre}, mu=0.2)
    term.backward()
    # 0.2 / 2 * (0.25 + 0.25 + 4) = 0.45 ; gradient mu * (w - centre) = 0.2 * [0.5, -0.5, -2]
    assert term.item() == pytest.approx(0.45)
    assert w.grad is not None
    assert torch.allclose(w.grad, torch.tensor([0.1, -0.1, -0.4]))


def test_proximal_gradient_reaches_the_optimiser(tiles: dict[int, HospitalData]) -> None:
    # One SGD step (one batch, no momentum, no weight decay) with and without the proximal term from the same
    # start and seed: the cross-entropy gradients are identical, so the difference of the two results must be
    # exactly -lr * mu * (w0 - centre). A term built on detached values (a known FedAMP bug) would give 0.
    lr, mu = 0.1, 0.5
    plain, prox = _client(tiles[0], nhead=0), _client(tiles[0], nhead=0)
    w0 = {k: v.detach().clone() for k, v in plain.model.state_dict().items()}
    gen = torch.Generator().manual_seed(3)
    centre = {k: v + torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in w0.items()}
    plain.train(TrainInstruction(0, Recipe(epochs=1, lr=lr)), server_round=1, seed=11)
    recipe = Recipe(epochs=1, lr=lr, prox_mu=mu)
    prox.train(TrainInstruction(0, recipe, prox_centre=centre), server_round=1, seed=11)
    for name, param in prox.model.named_parameters():
        difference = param.detach() - dict(plain.model.named_parameters())[name].detach()
        expected = -lr * mu * (w0[name] - centre[name])
        assert torch.allclose(difference, expected, atol=2e-6), name


def test_head_phase_leaves_the_base_untouched_and_base_phase_the_head(tiles: dict[int, HospitalData]) -> None:
    head_only = _client(tiles[0], nhead=2)
    both = _client(tiles[0], nhead=2)
    units = split_units(head_only.model)
    head, base = head_keys(units, 2), base_keys(units, 2)
    before = {k: v.clone() for k, v in head_only.model.state_dict().items()}
    head_only.train(TrainInstruction(0, Recipe(epochs=0, head_epochs=1, lr=0.1)), server_round=1, seed=5)
    after = head_only.model.state_dict()
    # base frozen entirely: weights and BatchNorm running statistics
    assert every(torch.equal(before[k], after[k]) for k in base)
    assert any(not torch.equal(before[k], after[k]) for k in head)
    # head epochs, then base epochs: the base phase does not move the head trained in the first phase
    reply = both.train(TrainInstruction(0, Recipe(epochs=1, head_epochs=1, lr=0.1)), server_round=1, seed=5)
    assert every(torch.equal(after[k], both.model.state_dict()[k]) for k in head)
    assert any(not torch.equal(before[k], both.model.state_dict()[k]) for k in base)
    assert set(reply.shared) == set(base)  # only the base is uploaded


def test_nan_loss_names_client_and_round_and_says_lower_lr(tiles: dict[int, HospitalData]) -> None:
    client = _client(tiles[2])
    with torch.no_grad():
        client.model.get_parameter("classifier.3.weight").fill_(float("nan"))
    with pytest.raises(FederationError, match=r"hospital 2, round 4: the training loss became nan; lower client\.lr"):
        client.train(TrainInstruction(2, Recipe(epochs=1, lr=0.01)), server_round=4, seed=0)


def test_single_class_test_split_has_undefined_auc(tiles: dict[int, HospitalData]) -> None:
    result = _client(tiles[1]).evaluate()
    assert result.auc is None
    assert 0.0 <= result.acc <= 1.0
    assert np.isfinite(result.loss)
    assert result.prob_abnormal.shape == (3,)


def test_auc_from_probabilities_is_exact() -> None:
    # pairs (abnormal, normal) ranked correctly: (0.35>0.1), (0.8>0.1), (0.8>0.4); wrong: (0.35<0.4) -> 3/4
    assert auc_or_none(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert auc_or_none(np.array([1, 1]), np.array([0.2, 0.9])) is None


def test_evaluation_counts_correct_predictions(tiles: dict[int, HospitalData]) -> None:
    client = _client(tiles[0])
    result = client.evaluate()
    with torch.no_grad():
        from federation.hospital.data import to_tensor

        predicted = client.model(to_tensor(tiles[0].test_x)).argmax(1).numpy()
    assert result.acc == pytest.approx(float((predicted == tiles[0].test_y).mean()))
    assert np.array_equal(result.prob_abnormal > 0.5, predicted == 1)


def test_fisher_trace_is_reported_when_asked(tiles: dict[int, HospitalData]) -> None:
    client = _client(tiles[0])
    reply = client.train(TrainInstruction(0, Recipe(epochs=1, lr=0.01, fisher_batch=2)), server_round=1, seed=2)
    assert reply.metrics["fisher_trace"] > 0.0
    plain = client.train(TrainInstruction(0, Recipe(epochs=1, lr=0.01)), server_round=2, seed=2)
    assert "fisher_trace" not in plain.metrics


def test_same_seed_same_training_with_augmentation(tiles: dict[int, HospitalData]) -> None:
    a, b = _client(tiles[0], batch_size=4, augment=True), _client(tiles[0], batch_size=4, augment=True)
    ra = a.train(TrainInstruction(0, Recipe(epochs=1, lr=0.05)), server_round=1, seed=9)
    rb = b.train(TrainInstruction(0, Recipe(epochs=1, lr=0.05)), server_round=1, seed=9)
    assert ra.metrics["train_loss"] == rb.metrics["train_loss"]
    assert every(torch.equal(ra.shared[k], rb.shared[k]) for k in ra.shared)
