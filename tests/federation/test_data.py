"""Loading a prepared dataset from its manifest, grayscale handling and augmentation."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from fl_tiny_dataset import LAYOUT, make_dataset

from federation.data import augment_batch, load_clients, make_augmenter, read_manifest, to_tensor
from federation.errors import FederationError


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("tiny"))


def _rewrite_manifest(src: Path, dst: Path, keep: object = None, drop_column: str | None = None) -> Path:
    shutil.copytree(src, dst)
    with (src / "manifest.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if callable(keep):
        rows = [r for r in rows if keep(r)]
    columns = [c for c in rows[0] if c != drop_column]
    with (dst / "manifest.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return dst


def test_clients_are_loaded_once_as_uint8_at_input_size(dataset: Path) -> None:
    clients = load_clients(dataset, input_size=32)
    assert sorted(clients) == [0, 1, 2]
    for c, data in clients.items():
        assert data.train_x.dtype == np.uint8
        assert data.train_x.shape[1:] == (32, 32, 3)
        assert data.num_train == sum(LAYOUT[c]["train"])
        assert data.num_test == sum(LAYOUT[c]["test"])
        assert int(data.train_y.sum()) == LAYOUT[c]["train"][1]  # abnormal = class 1
    assert clients[1].test_y.tolist() == [1, 1, 1]
    assert len(clients[0].test_paths) == 4
    assert clients[0].test_paths[0].startswith("client_00/test/")


def test_gray_client_is_replicated_to_three_identical_channels(dataset: Path) -> None:
    clients = load_clients(dataset, input_size=32)
    gray = clients[2]
    assert gray.grayscale
    assert not clients[0].grayscale
    assert np.array_equal(gray.train_x[..., 0], gray.train_x[..., 1])
    assert np.array_equal(gray.train_x[..., 0], gray.train_x[..., 2])
    # colour clients keep distinct channels (the fixture's normal tiles are pink: red > green)
    assert clients[0].train_x[..., 0].mean() > clients[0].train_x[..., 1].mean() + 20


def test_in_chans_1_makes_every_client_gray(dataset: Path) -> None:
    clients = load_clients(dataset, input_size=32, in_chans=1, clients=[0])
    assert clients[0].train_x.shape[1:] == (32, 32, 1)
    assert to_tensor(clients[0].train_x[:2]).shape == (2, 1, 32, 32)


def test_missing_tile_names_the_file_and_says_to_prepare_again(dataset: Path, tmp_path: Path) -> None:
    broken = _rewrite_manifest(dataset, tmp_path / "broken")
    victim = sorted((broken / "client_01" / "train" / "normal").glob("*.png"))[0]
    victim.unlink()
    with pytest.raises(FederationError, match=rf"{victim.name}.*re-run gastric-fl prepare"):
        load_clients(broken, input_size=32)


def test_empty_client_is_a_clear_error(dataset: Path, tmp_path: Path) -> None:
    no_client_1 = _rewrite_manifest(dataset, tmp_path / "gap", keep=lambda r: r["client"] != "1")
    with pytest.raises(FederationError, match=r"client\(s\) \[1\] have no tiles"):
        load_clients(no_client_1, input_size=32)
    no_test = _rewrite_manifest(
        dataset, tmp_path / "notest", keep=lambda r: not (r["client"] == "2" and r["split"] == "test")
    )
    with pytest.raises(FederationError, match="client 2 has 5 training and 0 test tiles"):
        load_clients(no_test, input_size=32)


def test_manifest_problems_are_reported(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FederationError, match=r"manifest\.csv not found"):
        read_manifest(tmp_path)
    no_label = _rewrite_manifest(dataset, tmp_path / "nolabel", drop_column="label")
    with pytest.raises(FederationError, match=r"lacks the columns \['label'\]"):
        read_manifest(no_label)


def test_augmentation_is_deterministic_per_seed_and_keeps_shape(dataset: Path) -> None:
    batch = load_clients(dataset, input_size=32, clients=[0])[0].train_x[:6]
    first = augment_batch(make_augmenter(7), batch)
    again = augment_batch(make_augmenter(7), batch)
    other = augment_batch(make_augmenter(8), batch)
    assert first.shape == batch.shape
    assert first.dtype == np.uint8
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    # flips/rotations keep the pixels; hue/saturation/brightness shifts are mild: no channel mean moves by a
    # quarter of the range (an inverted or recoloured tile would)
    assert np.abs(first.reshape(6, -1, 3).mean(1) - batch.reshape(6, -1, 3).mean(1)).max() < 64


def test_to_tensor_normalises_with_imagenet_statistics() -> None:
    white = np.full((1, 2, 2, 3), 255, dtype=np.uint8)
    out = to_tensor(white)
    expected = (1.0 - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225])
    assert out.shape == (1, 3, 2, 2)
    assert torch.allclose(out[0, :, 0, 0], expected)
