"""The GPU training path (federation.hospital.gpu, issue 32), checked on the CPU: the device-side augmentation's draws
follow the distributions of the CPU path's albumentations pipeline and each transform is exact on hand-made tiles;
bf16 autocast runs; the mean that replaces adaptive pooling changes nothing but the kernel; the device path of the
client trains and evaluates, and gives the same figures twice from one seed."""

from __future__ import annotations

import colorsys
import json
from pathlib import Path

import albumentations as A
import numpy as np
import pytest
import torch
from support.checks import every
from torch import nn

from federation.hospital import dp_sgd, gpu
from federation.hospital.data import HospitalData, make_augmenter
from federation.hospital.trainer import Trainer
from federation.wire.contract import Recipe, TrainInstruction
from models import base_keys, create_model, split_units

N = 20_000  # draws: the shares below are within 4 standard errors (0.5 / sqrt(N) = 0.0035)


def test_the_draws_follow_the_cpu_paths_distributions() -> None:
    # the limits are albumentations' own in the CPU path's pipeline
    transforms = {type(t).__name__: t for t in make_augmenter(0).transforms}
    hsv, bc = transforms["HueSaturationValue"], transforms["RandomBrightnessContrast"]
    assert (hsv.hue_shift_limit, hsv.sat_shift_limit, hsv.val_shift_limit, hsv.p) == (
        (-gpu.HUE_SHIFT, gpu.HUE_SHIFT), (-gpu.SAT_SHIFT, gpu.SAT_SHIFT), (-gpu.VAL_SHIFT, gpu.VAL_SHIFT), gpu.HSV_P
    )  # fmt: skip
    assert (bc.brightness_limit, bc.contrast_limit, bc.p) == (
        (-gpu.BRIGHTNESS, gpu.BRIGHTNESS), (-gpu.CONTRAST, gpu.CONTRAST), gpu.BC_P
    )  # fmt: skip
    assert isinstance(transforms["SquareSymmetry"], A.SquareSymmetry)
    d = gpu.draw(N, torch.Generator().manual_seed(7), torch.device("cpu"))
    counts = torch.bincount(d.which, minlength=8).double() / N
    assert counts.tolist() == pytest.approx([1 / 8] * 8, abs=0.012)  # each symmetry 1/8 (s.e. 0.0023)
    assert float(d.hsv_on.double().mean()) == pytest.approx(0.5, abs=0.014)
    assert float(d.bc_on.double().mean()) == pytest.approx(0.5, abs=0.014)
    for values, low, high in (
        (d.hue, -8, 8),
        (d.sat, -12, 12),
        (d.val, -8, 8),
        (d.alpha, 0.9, 1.1),
        (d.beta, -0.1, 0.1),
    ):
        assert float(values.min()) >= low
        assert float(values.max()) <= high
        # uniform: mean at the centre, variance (high - low)^2 / 12
        assert float(values.mean()) == pytest.approx((low + high) / 2, abs=(high - low) * 0.01)
        assert float(values.var()) == pytest.approx((high - low) ** 2 / 12, rel=0.04)
    # the same seed draws the same values
    again = gpu.draw(N, torch.Generator().manual_seed(7), torch.device("cpu"))
    assert torch.equal(again.which, d.which)
    assert torch.equal(again.alpha, d.alpha)


def _none(n: int, which: int = 0) -> gpu.Draws:
    zeros = torch.zeros(n)
    off = torch.zeros(n, dtype=torch.bool)
    return gpu.Draws(torch.full((n,), which), off, zeros, zeros, zeros, off, torch.ones(n), zeros)


def test_each_symmetry_is_the_square_symmetry_it_names() -> None:
    tile = torch.arange(2 * 3 * 3 * 1, dtype=torch.uint8).view(2, 3, 3, 1)
    seen = set()
    for code in range(8):
        out = gpu.apply(tile, _none(2, code))
        expected = np.rot90(np.flip(tile.numpy(), axis=2) if code >= 4 else tile.numpy(), k=code % 4, axes=(1, 2))
        assert np.array_equal(out.numpy(), expected)
        seen.add(out.numpy().tobytes())
    assert len(seen) == 8  # eight different images: the whole group


def test_the_colour_shifts_are_exact_on_hand_made_tiles() -> None:
    rgb = torch.tensor([[[[200, 100, 50]]]], dtype=torch.uint8)  # one pixel, (1, 1, 1, 3)
    base = _none(1)
    hue = gpu.Draws(base.which, torch.tensor([True]), torch.tensor([8.0]), torch.tensor([-12.0]), torch.tensor([8.0]),
                    base.bc_on, base.alpha, base.beta)  # fmt: skip
    out = gpu.apply(rgb, hue)[0, 0, 0].tolist()
    h, s, v = colorsys.rgb_to_hsv(200 / 255, 100 / 255, 50 / 255)
    r, g, b = colorsys.hsv_to_rgb((h + 8 / 180) % 1.0, s - 12 / 255, min(v + 8 / 255, 1.0))
    assert out == [round(r * 255), round(g * 255), round(b * 255)]
    two = torch.tensor([[[[200, 100, 50], [240, 10, 0]]] * 2], dtype=torch.uint8)  # (1, 2, 2, 3): tiles are square
    bc = gpu.Draws(base.which, base.hsv_on, base.hue, base.sat, base.val, torch.tensor([True]), torch.tensor([1.2]),
                   torch.tensor([0.05]))  # fmt: skip
    # x * 1.2 + 0.05 * 255, rounded, clipped to 255
    assert gpu.apply(two, bc)[0, 0].tolist() == [[253, 133, 73], [255, 25, 13]]
    gray = torch.tensor([[[[250]]]], dtype=torch.uint8)
    assert gpu.apply(gray, hue)[0, 0, 0].tolist() == [255]  # the value shift only, clipped
    assert torch.equal(gpu.apply(rgb, base), rgb)  # nothing drawn: nothing changed


def test_normalise_on_the_device_matches_the_cpu_and_is_channels_last() -> None:
    from federation.hospital.data import to_tensor
    from models.preprocess import default_stats

    images = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    x = gpu.normalise(torch.from_numpy(images), *default_stats(3))
    assert x.shape == (4, 3, 8, 8)
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(x, to_tensor(images), atol=1e-6)


def test_normalise_makes_its_statistics_once_per_device_and_checks_the_channels() -> None:
    """The per-channel statistics are built on the device once, not at every step (a blocking copy to a GPU waits for
    its queued work); the same values, the same tensors."""
    from models.preprocess import default_stats

    images = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (2, 4, 4, 3), dtype=np.uint8))
    gpu._stats_on.cache_clear()
    first = gpu.normalise(images, *default_stats(3))
    second = gpu.normalise(images, *default_stats(3))
    info = gpu._stats_on.cache_info()
    assert (info.misses, info.hits) == (1, 1)
    assert torch.equal(first, second)
    with pytest.raises(ValueError, match="3 channels but 1 means"):
        gpu.normalise(images, [0.5], [0.2])


def test_bf16_autocast_runs_and_fp32_is_left_alone() -> None:
    layer = nn.Linear(4, 2)
    x = torch.ones(3, 4)
    with gpu.autocast(torch.device("cpu"), "bf16"):
        assert layer(x).dtype == torch.bfloat16
    with gpu.autocast(torch.device("cpu"), "fp32"):
        assert layer(x).dtype == torch.float32


def test_the_mean_that_replaces_adaptive_pooling_changes_only_the_kernel() -> None:
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small").eval()
    keys = list(model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    before = model(x)
    assert gpu.mean_pools(model) == 10  # 9 squeeze-excitation blocks and the head's pooling
    assert not [m for m in model.modules() if isinstance(m, nn.AdaptiveAvgPool2d)]
    assert list(model.state_dict()) == keys
    assert torch.allclose(model(x), before, atol=1e-5)
    assert gpu.make_deterministic(model, torch.device("cpu")) == 0  # nothing to do on the CPU


def _client(on_device: bool, precision: str = "fp32") -> Trainer:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (24, 32, 32, 3), dtype=np.uint8)
    y = (np.arange(24) % 2).astype(np.int64)
    data = HospitalData(0, x, y, x[:10], y[:10], [f"t{i}.png" for i in range(10)], grayscale=False)
    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small")
    client = Trainer(data, model, base_keys(split_units(model), 0), batch_size=8, eval_batch_size=16, augment=True,
                    precision=precision)  # fmt: skip
    client.batches.on_gpu = on_device  # the device path, run on the CPU's tensors
    return client


def test_the_device_path_trains_evaluates_and_repeats_itself() -> None:
    recipe = Recipe(epochs=1, lr=0.01, momentum=0.9, fisher_batch=0)
    results = []
    for _ in range(2):
        client = _client(on_device=True)
        reply = client.train(TrainInstruction(0, recipe), server_round=1, seed=3)
        evaluated = client.evaluate()
        results.append((reply.metrics["train_loss"], evaluated.loss, evaluated.probs))
        assert "train" in client.batches._held  # the tiles were held as uint8 tensors, not rebuilt per batch
        assert client.batches._held["train"].dtype == torch.uint8
    assert np.isfinite(results[0][0])
    assert results[0][0] == results[1][0]
    assert results[0][1] == results[1][1]
    assert np.array_equal(results[0][2], results[1][2])
    # the CPU path with the same seed trains on other augmented tiles: a different loss, the same scale
    cpu = _client(on_device=False).train(TrainInstruction(0, recipe), server_round=1, seed=3).metrics["train_loss"]
    assert cpu != results[0][0]
    assert abs(cpu - results[0][0]) < 1.0


def test_bf16_training_runs_on_both_paths() -> None:
    recipe = Recipe(epochs=1, lr=0.01, momentum=0.9, fisher_batch=0)
    for on_device in (False, True):
        client = _client(on_device, precision="bf16")
        loss = client.train(TrainInstruction(0, recipe), server_round=1, seed=3).metrics["train_loss"]
        assert np.isfinite(loss)
        assert client.evaluate().probs.dtype == np.float64


def _figures(run: Path) -> list[dict[str, object]]:
    """``metrics.jsonl`` without its timings (wall seconds differ run to run)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [{k: v for k, v in row.items() if "seconds" not in k} for row in rows]


def test_a_deterministic_run_gives_the_same_metrics_twice(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.cli import run_cli
    from support.tiny_dataset import TINY_SETTINGS

    settings = [arg for setting in (*TINY_SETTINGS, "run.deterministic=true") for arg in ("--set", setting)]
    runs = [tmp_path / "first", tmp_path / "second"]
    for run in runs:
        assert run_cli(monkeypatch, "train", "--data", str(dataset), "--out", str(run), "-q", *settings) == 0
    first, second = (_figures(run) for run in runs)
    assert len(first) >= 4  # 2 rounds x 2 hospitals at least
    assert first == second
    assert "deterministic = true" in (runs[0] / "config.toml").read_text(encoding="utf-8")


def test_a_non_finite_loss_on_the_device_path_stops_the_round_in_the_same_words() -> None:
    from federation.errors import Diverged

    client = _client(on_device=True)
    with torch.no_grad():
        next(iter(client.model.parameters())).fill_(float("nan"))
    recipe = Recipe(epochs=1, lr=0.01, momentum=0.9, fisher_batch=0, precise_bn=False)
    with pytest.raises(Diverged, match=r"hospital 0, round 4: the training loss became nan; lower client.lr"):
        client.train(TrainInstruction(0, recipe), server_round=4, seed=3)


def test_an_epoch_is_augmented_ahead_in_chunks_with_each_tiles_own_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """`BatchSource.device_epoch`: the tiles in the epoch's order, each augmented with the draws the round's device
    generator gives it in that order, chunk by chunk; labels follow the order. 24 tiles in chunks of 5 (5 chunks,
    the last of 4)."""
    monkeypatch.setattr(gpu, "EPOCH_CHUNK", 5)
    client = _client(on_device=True)
    source = client.batches
    source._device_generator = torch.Generator().manual_seed(11)
    order = torch.randperm(24, generator=torch.Generator().manual_seed(2))
    tiles, labels = source.device_epoch(order)
    images = torch.from_numpy(client.data.train_x).index_select(0, order)
    again = torch.Generator().manual_seed(11)
    expected = torch.cat([gpu.augment(images[i : i + 5], again) for i in range(0, 24, 5)])
    assert tiles.dtype == torch.uint8
    assert tiles.shape == (24, 32, 32, 3)
    assert torch.equal(tiles, expected)
    assert not torch.equal(tiles, images)  # augmented, not the raw tiles
    assert labels.tolist() == [int(client.data.train_y[i]) for i in order.tolist()]
    # without augmentation the epoch is the raw tiles in order, and no draw is taken
    source.augment = False
    state = source._device_generator.get_state()
    plain, _ = source.device_epoch(order)
    assert torch.equal(plain, images)
    assert torch.equal(source._device_generator.get_state(), state)


def test_dp_training_on_the_device_path_augments_its_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DP-SGD phase on the device path feeds augmented tiles (it fed raw ones), from the device generator."""
    seen: list[torch.Tensor] = []
    client = _client(on_device=True)
    client.model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    raw = client.batches.device_batch("train", torch.arange(24))[0]
    seen.clear()
    recipe = Recipe(epochs=1, lr=0.01, momentum=0.9, fisher_batch=0, precise_bn=False, dp_noise_multiplier=1.0,
                    dp_max_grad_norm=1.0, dp_sample_rate=0.5, dp_unit="tile")  # fmt: skip
    # units of two tiles (a batch of one tile of 32 px leaves BatchNorm one value per channel)
    monkeypatch.setattr(
        dp_sgd, "privacy_units", lambda _data, _recipe: [torch.tensor([2 * i, 2 * i + 1]) for i in range(12)]
    )
    client.train(TrainInstruction(0, recipe), server_round=1, seed=3)
    tiles = [x[j] for x in seen for j in range(x.shape[0])]
    assert len(seen) > 0
    assert every(x.shape[0] == 2 for x in seen)
    matches = sum(int(any(torch.equal(t, r) for r in raw)) for t in tiles)
    assert matches < len(tiles) / 2  # raw tiles would match every time; an augmented one rarely (1 in 32)
