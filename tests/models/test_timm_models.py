"""timm architectures by name (``timm/<timm model name>``) next to the four torchvision networks of paper 001's
Table 3, which must build exactly as torchvision's own builders do (their published numbers depend on it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support.checks import every
from torch import nn
from torchvision import models as tvm

from models import (
    ModelError,
    base_keys,
    check_input_size,
    check_model_name,
    create_model,
    head_keys,
    is_timm_name,
    layer_unit_count,
    layer_units,
    min_input_size,
    split_units,
)
from models.bundle import BundleError, ModelCard, load_bundle, write_bundle
from models.preprocess import Preprocess
from models.registry import BATCHNORM_MOMENTUM

# timm's MobileNetV3-Small at half width (0.57 M parameters): small, and built of timm's norm + activation layers.
TIMM = "timm/mobilenetv3_small_050"
TIMM_UNITS = [
    "conv_stem+bn1",
    "blocks.0",
    *(f"blocks.{stage}.{block}" for stage, count in ((1, 2), (2, 3), (3, 2), (4, 3)) for block in range(count)),
    "blocks.5",
    "conv_head+classifier",
]

TORCHVISION: dict[str, Callable[..., nn.Module]] = {
    "mobilenet_v3_small": tvm.mobilenet_v3_small,
    "resnet18": tvm.resnet18,
    "efficientnet_b0": tvm.efficientnet_b0,
    "alexnet": tvm.alexnet,
}


def _save(model: nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.mark.parametrize("name", list(TORCHVISION))
def test_the_four_torchvision_networks_build_exactly_as_torchvision_does(name: str) -> None:
    """Same modules, same initialisation, same parameter order as torchvision's builder under the same seed (only
    the BatchNorm momentum differs, set to 0.1 as before timm names existed)."""
    torch.manual_seed(7)
    ours = create_model(name)
    torch.manual_seed(7)
    reference = TORCHVISION[name](weights=None, num_classes=2)
    for module in reference.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.momentum = BATCHNORM_MOMENTUM
    assert type(ours) is type(reference)
    assert repr(ours) == repr(reference)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in reference.named_parameters()]
    mine, theirs = ours.state_dict(), reference.state_dict()
    assert list(mine) == list(theirs)
    assert every(torch.equal(mine[k], theirs[k]) for k in mine)


def test_a_torchvision_network_still_gets_plain_group_norm() -> None:
    model = create_model("mobilenet_v3_small", norm="group")
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms
    assert every(type(m) is nn.GroupNorm for m in norms)


def test_timm_names_are_checked_by_form_without_torch() -> None:
    check_model_name(TIMM)
    check_model_name("timm/resnet10t")
    assert is_timm_name(TIMM)
    assert not is_timm_name("resnet18")
    assert min_input_size(TIMM) == 32
    check_input_size(TIMM, 32)
    for bad, words in [
        ("timm/resnet10t.a1_in1k", "pretrained tag"),
        ("timm/", "not a timm model name"),
        ("timm/Res-Net", "not a timm model name"),
        ("timm/hf-hub:timm/resnet18", "not a timm model name"),
        ("resnet10t", r"timm/<timm model name>"),
    ]:
        with pytest.raises(ModelError, match=words) as info:
            check_model_name(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(ModelError, match="layer_unit_count"):
        layer_units(TIMM)
    # models.names still imports no torch (the configuration's and the dashboard's checks)
    code = "import sys, models.names as n; n.check_model_name('timm/resnet10t'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_unknown_timm_model_is_one_line_naming_the_value_and_what_to_do() -> None:
    with pytest.raises(ModelError) as info:
        create_model("timm/no_such_net")
    message = str(info.value)
    assert "\n" not in message
    assert "'timm/no_such_net'" in message
    assert "has no model 'no_such_net'" in message
    assert "timm.list_models()" in message


def test_a_small_timm_model_builds_and_splits_by_nhead() -> None:
    model = create_model(TIMM)
    assert type(model).__module__.startswith("timm.")
    units = split_units(model)
    assert [name for name, _ in units] == TIMM_UNITS
    assert layer_unit_count(TIMM) == len(units) == 14
    # every state_dict entry (BatchNorm buffers included) lands in exactly one unit
    flat = [k for _, keys in units for k in keys]
    assert sorted(flat) == sorted(model.state_dict())
    for nhead in range(len(units) + 1):
        head, base = head_keys(units, nhead), base_keys(units, nhead)
        assert not set(head) & set(base)
        assert len(head) + len(base) == len(flat)
    # nhead=1 keeps timm's head (its forward_head: conv_head and the classifier)
    assert head_keys(units, 1) == ["conv_head.weight", "conv_head.bias", "classifier.weight", "classifier.bias"]
    with pytest.raises(ModelError, match=r"0\.\.14"):
        base_keys(units, 15)
    with torch.no_grad():
        assert model.eval()(torch.zeros(1, 3, min_input_size(TIMM), min_input_size(TIMM))).shape == (1, 2)


def test_a_timm_model_without_timms_block_grouping_is_refused() -> None:
    model = create_model(TIMM)
    model.group_matcher = None  # type: ignore[assignment]
    with pytest.raises(ModelError, match="no group_matcher"):
        split_units(model)


def test_a_timm_model_trains_one_step() -> None:
    torch.manual_seed(0)
    model = create_model(TIMM).train()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.functional.cross_entropy(model(torch.rand(4, 3, 32, 32)), torch.tensor([0, 1, 0, 1]))
    loss.backward()
    optimiser.step()
    assert torch.isfinite(loss)
    assert not torch.equal(before["classifier.weight"], model.classifier.weight)
    assert not torch.equal(before["conv_stem.weight"], model.conv_stem.weight)


def test_a_local_weights_file_loads_into_a_timm_model(tmp_path: Path) -> None:
    torch.manual_seed(3)
    source = create_model(TIMM)
    loaded = create_model(TIMM, weights=_save(source, tmp_path / "two.safetensors"))
    mine, theirs = loaded.state_dict(), source.state_dict()
    assert list(mine) == list(theirs)
    assert every(torch.equal(mine[k], theirs[k]) for k in mine)

    # a 1000-class file (timm's ImageNet head): only the classifier keeps its random weights, conv_head loads
    imagenet = create_model(TIMM, num_classes=1000)
    two = create_model(TIMM, weights=_save(imagenet, tmp_path / "in1k.safetensors"))
    assert torch.equal(two.state_dict()["conv_head.weight"], imagenet.state_dict()["conv_head.weight"])
    assert two.state_dict()["classifier.weight"].shape == (2, 1024)

    # an RGB file into a one-channel model: timm's adapt_input_conv sums the stem's RGB filters
    gray = create_model(TIMM, in_chans=1, weights=tmp_path / "two.safetensors")
    stem = theirs["conv_stem.weight"]
    assert torch.allclose(gray.state_dict()["conv_stem.weight"], stem.sum(dim=1, keepdim=True))

    with pytest.raises(ModelError, match=f"does not fit {TIMM}"):
        create_model(TIMM, weights=_save(create_model("mobilenet_v3_small"), tmp_path / "tv.safetensors"))


def test_a_one_channel_timm_model_takes_gray_tiles() -> None:
    model = create_model(TIMM, in_chans=1).eval()
    assert model.state_dict()["conv_stem.weight"].shape[1] == 1
    with torch.no_grad():
        assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 2)


def test_group_norm_keeps_timms_activations() -> None:
    """timm's BatchNormAct2d holds the activation after the norm; its GroupNorm replacement must keep it."""
    batch = create_model(TIMM)
    group = create_model(TIMM, norm="group")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in group.modules())
    acts = {n: type(m.act) for n, m in batch.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    assert acts
    assert {n: type(group.get_submodule(n).act) for n in acts} == acts
    assert len(split_units(group)) == len(TIMM_UNITS)
    with torch.no_grad():
        assert group.eval()(torch.rand(1, 3, 32, 32)).shape == (1, 2)


def test_a_bundle_of_a_timm_model_loads(tmp_path: Path) -> None:
    card = ModelCard(
        architecture=TIMM,
        num_classes=2,
        class_names=("normal", "abnormal"),
        nhead=1,
        head_units=("conv_head+classifier",),
        preprocess=Preprocess(input_size=32, in_chans=3, tile_px=64, scale=0.5, grayscale=False),
        tiling=None,
        threshold=0.5,
    )
    torch.manual_seed(4)
    state = create_model(TIMM).state_dict()
    write_bundle(tmp_path / "ok", card, state)
    bundle = load_bundle(tmp_path / "ok")
    assert torch.equal(bundle.model.state_dict()["classifier.weight"], state["classifier.weight"])
    # a card naming a model the installed timm lacks: one line, through BundleError
    write_bundle(tmp_path / "gone", card, state)
    path = tmp_path / "gone" / "model.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"architecture": "timm/no_such_net"}))
    with pytest.raises(BundleError, match="has no model 'no_such_net'") as info:
        load_bundle(tmp_path / "gone")
    assert "\n" not in str(info.value)
