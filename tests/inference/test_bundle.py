"""The model card: written by every hospital after an evaluated round, and read back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.slides import TinyRun

from models import create_model
from models.bundle import BundleError, ModelCard, TileGrid, load_bundle, read_card, write_bundle
from models.preprocess import IMAGENET_MEAN_RGB, Preprocess


def _card(**changes: object) -> ModelCard:
    fields: dict[str, object] = {
        "architecture": "mobilenet_v3_small",
        "num_classes": 2,
        "class_names": ("normal", "abnormal"),
        "nhead": 3,
        "head_units": ("features.12", "classifier.0", "classifier.3"),
        "preprocess": Preprocess(input_size=48, in_chans=3, tile_px=96, scale=0.75, grayscale=True),
        "tiling": TileGrid(128, 128, 64, 220, 0.5, 0.4, "bot"),
        "threshold": 0.3,
        "threshold_source": "set by hand",  # not the default 0.5's: a card saying so would be a hand edit
        "run_id": "r1",
        "round": 4,
        "hospital": 2,
        "dataset": {"path": "data/prepared/x", "manifest_sha256": "ab" * 32},
        "metrics": {"auc": 0.91, "sensitivity": None},
        "written_at": "2026-01-01T00:00:00+00:00",
    }
    fields.update(changes)
    return ModelCard(**fields)  # type: ignore[arg-type]


def test_the_card_round_trips(tmp_path: Path) -> None:
    card = _card()
    torch.manual_seed(0)
    state = create_model("mobilenet_v3_small").state_dict()
    write_bundle(tmp_path, card, state)
    assert read_card(tmp_path) == card
    assert read_card(tmp_path / "model.json") == card
    assert ModelCard.from_json(json.loads(json.dumps(card.to_json()))) == card
    bundle = load_bundle(tmp_path)
    assert bundle.card == card
    assert not bundle.model.training
    assert torch.equal(bundle.model.state_dict()["classifier.3.weight"], state["classifier.3.weight"])
    assert card.preprocess.mean == IMAGENET_MEAN_RGB


def test_weights_from_another_round_than_the_card_are_refused(tmp_path: Path) -> None:
    write_bundle(tmp_path, _card(round=3), create_model("mobilenet_v3_small").state_dict())
    write_bundle(tmp_path, _card(round=4))
    with pytest.raises(BundleError, match=r"round 3 but model\.json describes round 4"):
        load_bundle(tmp_path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"architecture": "vgg"}, "unknown architecture"),
        ({"class_names": ("normal",)}, "class_names"),
        ({"threshold": 1.5}, "threshold"),
        ({"preprocess": {"input_size": 32, "in_chans": 2}}, "in_chans"),
        ({"format_version": 99}, "format_version"),
        ({"tiling": {"source_px": 0}}, "wrong type|positive"),
    ],
)
def test_a_bad_card_is_one_clear_line(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    data = _card().to_json() | changes
    (tmp_path / "model.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BundleError, match=message) as info:
        read_card(tmp_path)
    assert "\n" not in str(info.value)
    assert "model.json" in str(info.value)


def test_each_hospital_of_a_run_leaves_a_card_that_matches_its_run(tiny_run: TinyRun) -> None:
    for client in (0, 1):
        folder = tiny_run.bundle(client)
        card = read_card(folder)
        hospital = json.loads((folder / "hospital.json").read_text(encoding="utf-8"))
        entry = tiny_run.record["clients"][client]
        assert (card.run_id, card.round, card.hospital) == (hospital["run_id"], 1, client)
        assert card.dataset["manifest_sha256"] == hospital["manifest_sha256"]
        assert card.preprocess.tile_px == entry["tile_px"] == 64
        assert card.preprocess.grayscale is (client == 1)
        assert (card.preprocess.input_size, card.preprocess.in_chans) == (32, 3)
        assert card.tiling is not None
        assert card.tiling.source_px == entry["source_px"]
        assert card.tiling.stride_px == entry["stride_source_px"]
        assert card.tiling.white_max == 0.4
        assert card.threshold == 0.5
        assert card.class_names == ("normal", "abnormal")
        assert card.metrics["tiles"] == sum(entry["tiles"]["test"].values())
        load_bundle(folder)  # weights fit the card


def test_weights_with_nan_or_infinity_are_refused_in_one_line(tmp_path: Path) -> None:
    state = create_model("mobilenet_v3_small").state_dict()
    state["features.0.0.weight"][0, 0, 0, 0] = float("nan")
    state["classifier.3.bias"][:] = float("-inf")
    write_bundle(tmp_path, _card(), state)
    with pytest.raises(BundleError) as info:
        load_bundle(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'model.safetensors'}: features.0.0.weight holds 1 NaN or infinite value(s) (2 tensors in all), "
        "so the model cannot score a slide; the training diverged or the file is damaged: export the model from a run "
        "that trained normally (e.g. with a lower learning rate)"
    )
