"""Loading a prepared dataset from its manifest, grayscale handling and augmentation."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from support.checks import every
from support.tiny_dataset import LAYOUT

from federation.errors import FederationError
from federation.hospital.data import (
    augment_batch,
    extract_hospital,
    load_hospitals,
    make_augmenter,
    read_dataset,
    read_manifest,
    to_tensor,
)


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
    clients = load_hospitals(dataset, input_size=32)
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
    clients = load_hospitals(dataset, input_size=32)
    gray = clients[2]
    assert gray.grayscale
    assert not clients[0].grayscale
    assert np.array_equal(gray.train_x[..., 0], gray.train_x[..., 1])
    assert np.array_equal(gray.train_x[..., 0], gray.train_x[..., 2])
    # colour clients keep distinct channels (the fixture's normal tiles are pink: red > green)
    assert clients[0].train_x[..., 0].mean() > clients[0].train_x[..., 1].mean() + 20


def test_in_chans_1_makes_every_client_gray(dataset: Path) -> None:
    clients = load_hospitals(dataset, input_size=32, in_chans=1, hospitals=[0])
    assert clients[0].train_x.shape[1:] == (32, 32, 1)
    assert to_tensor(clients[0].train_x[:2]).shape == (2, 1, 32, 32)


def test_missing_tile_names_the_file_and_says_to_prepare_again(dataset: Path, tmp_path: Path) -> None:
    broken = _rewrite_manifest(dataset, tmp_path / "broken")
    victim = sorted((broken / "client_01" / "train" / "normal").glob("*.png"))[0]
    victim.unlink()
    with pytest.raises(FederationError, match=rf"{victim.name}.*re-run gastric-fl prepare"):
        load_hospitals(broken, input_size=32)


def test_empty_client_is_a_clear_error(dataset: Path, tmp_path: Path) -> None:
    no_client_1 = _rewrite_manifest(dataset, tmp_path / "gap", keep=lambda r: r["client"] != "1")
    with pytest.raises(FederationError, match=r"hospital\(s\) \[1\] have no tiles"):
        load_hospitals(no_client_1, input_size=32)
    no_test = _rewrite_manifest(
        dataset, tmp_path / "notest", keep=lambda r: not (r["client"] == "2" and r["split"] == "test")
    )
    with pytest.raises(FederationError, match="hospital 2 has 5 training and 0 test tiles"):
        load_hospitals(no_test, input_size=32)


def test_manifest_problems_are_reported(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(FederationError, match=r"manifest\.csv not found"):
        read_manifest(tmp_path)
    no_label = _rewrite_manifest(dataset, tmp_path / "nolabel", drop_column="label")
    with pytest.raises(FederationError, match=r"lacks the columns \['label'\]"):
        read_manifest(no_label)


def test_augmentation_is_deterministic_per_seed_and_keeps_shape(dataset: Path) -> None:
    batch = load_hospitals(dataset, input_size=32, hospitals=[0])[0].train_x[:6]
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


def _raw_hospitals(root: Path, slides: int = 12) -> None:
    """A SEED raw folder of ``slides`` 96 px slides ``patientNN.png`` (every other one abnormal; masks beside the
    even ones, in ``masks/`` for the odd ones) plus ``patient99.png`` without a mask (prepare skips it). Every slide
    is near-black noise, so prepare warns about each one by name; the noise keeps their pixels distinct."""
    (root / "masks").mkdir(parents=True)
    rng = np.random.default_rng(5)
    for k in range(slides):
        image = rng.integers(0, 11, size=(96, 96, 3), dtype=np.uint8)
        mask = np.zeros((96, 96), np.uint8)
        if k % 2:
            mask[8 * (k % 3) : 8 * (k % 3) + 70, 20:90] = 255
        cv2.imwrite(str(root / f"patient{k:02d}.png"), image)
        cv2.imwrite(str(root / (f"patient{k:02d}_mask.png" if k % 2 == 0 else f"masks/patient{k:02d}.png")), mask)
    cv2.imwrite(str(root / "patient99.png"), rng.integers(0, 11, size=(96, 96, 3), dtype=np.uint8))


def test_an_extracted_hospital_holds_no_name_of_another_hospitals_slides(tmp_path: Path) -> None:
    """`extract_hospital` on a dataset made by the real prepare: hospital 1's folder names none of hospitals 0 and
    2's slides or their files (in any file, nor in a path), still records its own slides, and loads as client 0."""
    from pipeline.config import build_config
    from pipeline.prepare import prepare_dataset

    raw, prepared = tmp_path / "raw", tmp_path / "prepared"
    _raw_hospitals(raw)
    settings: dict[str, dict[str, object]] = {
        "source": {"format": "seed", "input": raw},
        "split": {"clients": 3, "sizes": "equal", "test_fraction": 0.25, "seed": 0},
        "tiles": {"tile": 32},
        "clients": {"grayscale": [2], "scale": [1.0, 0.75, 0.5]},  # per-hospital settings: cut to hospital 1's
        "output": {"out": prepared, "workers": 1},
    }
    prepare_dataset(build_config(None, settings))
    original = json.loads((prepared / "prepare.json").read_text(encoding="utf-8"))
    with (prepared / "manifest.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    mine = {r["source"] for r in rows if r["client"] == "1"}
    others = {r["source"] for r in rows if r["client"] != "1"}
    others |= {s["source"] for s in original["slides"] if s["client"] != 1}
    others |= {s["source"] for s in original["skipped"]}
    assert mine
    assert others
    assert not mine & others
    assert any(s in json.dumps(original) for s in others)  # the multi-hospital record names them all

    own = extract_hospital(prepared, 1, tmp_path / "hospital1")

    foreign = sorted({*others, *(Path(s).stem for s in others)})  # "patient03.png" and "patient03" (masks/, tiles)
    extracted = sorted(own.rglob("*"))
    assert extracted
    for file in extracted:
        name = file.relative_to(own).as_posix()
        assert not [f for f in foreign if f in name], name
        if file.is_file():
            data = file.read_bytes()
            assert not [f for f in foreign if f.encode() in data], (name, [f for f in foreign if f.encode() in data])
    record = json.loads((own / "prepare.json").read_text(encoding="utf-8"))
    assert {s["source"] for s in record["slides"]} >= mine
    assert {s["client"] for s in record["slides"]} == {0}
    assert [c["client"] for c in record["clients"]] == [0]
    assert set(record["source_pixels_sha256"]) == {s["source"] for s in record["slides"]}
    # each slide's own mask, as _raw_hospitals placed it (beside the even slides, in masks/ for the odd ones)
    masks = {
        f"masks/{s}" if int(Path(s).stem.removeprefix("patient")) % 2 else f"{Path(s).stem}_mask.png"
        for s in record["source_pixels_sha256"]
    }
    assert set(record["source_sha256"]) == set(record["source_pixels_sha256"]) | masks
    assert every(record["source_sha256"][k] == original["source_sha256"][k] for k in record["source_sha256"])
    assert record["warnings"]
    assert every(w.split(":")[0] in mine for w in record["warnings"])
    assert record["totals"]["tiles"] == sum(1 for r in rows if r["client"] == "1")
    assert record["config"]["tiles"] == original["config"]["tiles"]
    assert record["config"]["clients"] == {"grayscale": [], "scale": [0.75], "tile": [], "group": []}
    assert record["clients"][0]["scale"] == 0.75
    assert record["classes"] == original["classes"]
    assert not {"report.md", "contact_sheet.png"} & {p.name for p in own.iterdir()}
    loaded, classes = read_dataset(own)
    assert {r.hospital for r in loaded} == {0}
    assert len(loaded) == sum(1 for r in rows if r["client"] == "1")
    assert classes == tuple(original["classes"])
    assert sorted(load_hospitals(own, input_size=32)) == [0]
