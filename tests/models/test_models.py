"""Model registry and the Eq. 1 head/base split (FedSAF paper 001, Table 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from models import (
    MODEL_NAMES,
    ModelError,
    base_keys,
    check_input_size,
    create_model,
    head_keys,
    min_input_size,
    split_units,
)

MOBILENET_UNITS = [f"features.{i}" for i in range(13)] + ["classifier.0", "classifier.3"]


def test_mobilenet_v3_small_has_the_papers_15_units_in_order() -> None:
    units = split_units(create_model("mobilenet_v3_small"))
    assert [name for name, _ in units] == MOBILENET_UNITS


@pytest.mark.parametrize(
    ("name", "count", "first", "last"),
    [
        ("resnet18", 11, "conv1", "fc"),
        ("efficientnet_b0", 10, "features.0", "classifier.1"),
        ("alexnet", 8, "features.0", "classifier.6"),
    ],
)
def test_units_of_the_other_models_partition_their_state_dict(name: str, count: int, first: str, last: str) -> None:
    model = create_model(name)
    units = split_units(model)
    assert len(units) == count
    assert (units[0][0], units[-1][0]) == (first, last)
    flat = [k for _, keys in units for k in keys]
    # every state_dict entry (BatchNorm buffers included) lands in exactly one unit, in state_dict order
    assert flat == list(model.state_dict())


def test_head_and_base_keys_split_at_nhead() -> None:
    units = split_units(create_model("mobilenet_v3_small"))
    head = head_keys(units, 2)
    base = base_keys(units, 2)
    assert head == ["classifier.0.weight", "classifier.0.bias", "classifier.3.weight", "classifier.3.bias"]
    assert not set(head) & set(base)
    assert base[0].startswith("features.0.")
    assert base[-1].startswith("features.12.")
    assert head_keys(units, 0) == []
    assert base_keys(units, 15) == []


@pytest.mark.parametrize("nhead", [-1, 16])
def test_nhead_out_of_range_is_rejected(nhead: int) -> None:
    units = split_units(create_model("mobilenet_v3_small"))
    with pytest.raises(ModelError, match=r"0\.\.15"):
        base_keys(units, nhead)


def test_shared_values_at_nhead_12_match_a_hand_count() -> None:
    # nhead=12 shares features.0..2. Hand count (BatchNorm: weight, bias, running mean/var = 4C, +1 counter):
    # features.0: conv 3->16 3x3 = 432, BN16 = 65                                         -> 497
    # features.1: dw 16 3x3 = 144, BN16 = 65, SE 16->8 (128+8), 8->16 (128+16), proj 16->16 = 256, BN16 = 65 -> 810
    # features.2: 16->72 = 1152, BN72 = 289, dw 72 3x3 = 648, BN72 = 289, 72->24 = 1728, BN24 = 97 -> 4203
    model = create_model("mobilenet_v3_small")
    state = model.state_dict()
    keys = base_keys(split_units(model), 12)
    assert sum(state[k].numel() for k in keys) == 497 + 810 + 4203


def test_unknown_model_and_too_small_input_give_clear_errors() -> None:
    with pytest.raises(ModelError, match="choose one of"):
        create_model("vgg16")
    assert min_input_size("alexnet") == 63
    with pytest.raises(ModelError, match="at least 63"):
        check_input_size("alexnet", 62)
    check_input_size("mobilenet_v3_small", 32)
    assert set(MODEL_NAMES) == {"mobilenet_v3_small", "resnet18", "efficientnet_b0", "alexnet", "fedavg_cnn"}


def test_fedavg_cnn_is_pfllibs_network_at_28_px() -> None:
    """PFLlib's FedAvgCNN(in_features=1, num_classes=10, dim=1024): the same state_dict (keys and shapes, 582,026
    parameters: 832 + 51,264 + 524,800 + 5,130) and, at 28 px, the same function (the added 4 x 4 pooling is the
    identity there); four layer units, the last PFLlib's head ``fc``."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = create_model("fedavg_cnn", num_classes=10, in_chans=1).eval()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == {
        "conv1.0.weight": (32, 1, 5, 5),
        "conv1.0.bias": (32,),
        "conv2.0.weight": (64, 32, 5, 5),
        "conv2.0.bias": (64,),
        "fc1.0.weight": (512, 1024),
        "fc1.0.bias": (512,),
        "fc.weight": (10, 512),
        "fc.bias": (10,),
    }
    assert sum(p.numel() for p in model.parameters()) == 582_026
    assert [name for name, _ in split_units(model)] == ["conv1", "conv2", "fc1", "fc"]
    x = torch.rand(3, 1, 28, 28)
    w = model.state_dict()
    out = F.max_pool2d(F.relu(F.conv2d(x, w["conv1.0.weight"], w["conv1.0.bias"])), 2)
    out = F.max_pool2d(F.relu(F.conv2d(out, w["conv2.0.weight"], w["conv2.0.bias"])), 2)
    out = F.relu(F.linear(torch.flatten(out, 1), w["fc1.0.weight"], w["fc1.0.bias"]))
    with torch.no_grad():
        assert torch.allclose(model(x), F.linear(out, w["fc.weight"], w["fc.bias"]), atol=1e-6)
    with pytest.raises(ModelError, match="at least 28"):
        check_input_size("fedavg_cnn", 27)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_torch_free_names_describe_the_built_models(name: str) -> None:
    """models.names (read by configuration checks without torch) says what the registry builds: the layer units
    nhead ranges over (Eq. 1), and the smallest input the network still turns into a prediction."""
    from models.names import LAYER_UNITS, layer_units
    from models.registry import _BUILDERS

    assert set(_BUILDERS) == set(MODEL_NAMES) == set(LAYER_UNITS)
    model = create_model(name).eval()
    assert layer_units(name) == len(split_units(model))
    side = min_input_size(name)
    with torch.no_grad():
        assert model(torch.zeros(1, 3, side, side)).shape == (1, 2)
    with pytest.raises(ModelError, match="choose one of"):
        layer_units("vgg16")


def test_one_channel_model_accepts_gray_input() -> None:
    model = create_model("mobilenet_v3_small", in_chans=1).eval()
    assert model.state_dict()["features.0.0.weight"].shape[1] == 1
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 2)
    with pytest.raises(ModelError, match="in_chans"):
        create_model("mobilenet_v3_small", in_chans=4)


def test_an_rgb_weights_file_loads_into_a_one_channel_model_through_timms_stem_adaptation(tmp_path: Path) -> None:
    torch.manual_seed(2)
    rgb = create_model("mobilenet_v3_small")
    path = tmp_path / "rgb.safetensors"
    save_file({k: v.contiguous() for k, v in rgb.state_dict().items()}, str(path))
    gray = create_model("mobilenet_v3_small", in_chans=1, weights=path).eval()
    stem = rgb.state_dict()["features.0.0.weight"]
    assert gray.state_dict()["features.0.0.weight"].shape == (16, 1, 3, 3)
    # one channel: the RGB filters summed, so a gray tile (equal channels) meets the same first layer
    assert torch.allclose(gray.state_dict()["features.0.0.weight"], stem.sum(dim=1, keepdim=True))
    assert torch.equal(
        gray.state_dict()["features.1.block.0.0.weight"], rgb.state_dict()["features.1.block.0.0.weight"]
    )
    tile = torch.rand(2, 1, 64, 64)
    assert torch.allclose(gray(tile), rgb.eval()(tile.expand(-1, 3, -1, -1)), atol=1e-5)
    # and back: a one-channel file into the RGB model, the filter repeated and scaled by 1/3
    one = tmp_path / "gray.safetensors"
    save_file({k: v.contiguous() for k, v in gray.state_dict().items()}, str(one))
    back = create_model("mobilenet_v3_small", weights=one)
    assert torch.allclose(
        back.state_dict()["features.0.0.weight"], stem.sum(dim=1, keepdim=True).repeat(1, 3, 1, 1) / 3
    )


def test_local_weights_file_is_loaded_and_mismatches_are_explained(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = create_model("mobilenet_v3_small")
    good = tmp_path / "good.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(good))
    loaded = create_model("mobilenet_v3_small", weights=good)
    assert torch.equal(loaded.state_dict()["features.0.0.weight"], source.state_dict()["features.0.0.weight"])

    # a 10-class file still loads into a 2-class model: only the output layer keeps its random weights
    ten = create_model("mobilenet_v3_small", num_classes=10)
    other = tmp_path / "ten.safetensors"
    save_file({k: v.contiguous() for k, v in ten.state_dict().items()}, str(other))
    two = create_model("mobilenet_v3_small", weights=other)
    assert torch.equal(two.state_dict()["classifier.0.weight"], ten.state_dict()["classifier.0.weight"])
    assert two.state_dict()["classifier.3.weight"].shape == (2, 1024)

    with pytest.raises(ModelError, match="does not exist"):
        create_model("mobilenet_v3_small", weights=tmp_path / "absent.safetensors")
    wrong = tmp_path / "resnet.safetensors"
    save_file({k: v.contiguous() for k, v in create_model("resnet18").state_dict().items()}, str(wrong))
    with pytest.raises(ModelError, match="does not fit mobilenet_v3_small"):
        create_model("mobilenet_v3_small", weights=wrong)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="not a readable safetensors"):
        create_model("mobilenet_v3_small", weights=junk)
