"""Shift detection (issue 47, part 1): the bundle's description of its hospital's tissue marks tiles unlike it.

A small trained run on the gastric tissue (24 synthetic slides of 384 px, 2 hospitals, hospital 1 grey, 128 px tiles
at half-tile stride, 2 rounds of FedAvg at 64 px input; about 20 s on 2 CPU cores). Slides unlike the training:
another hospital's stain (the stain/scanner regime's over-stained bluish lab, `pipeline.stain_profiles`) and a grey
scan for the colour hospital's model; its own held-out slides as they are; each slide at 2x magnification. A bundle
with a description of version 1 (before the scale statistic and the neighbourhood pooling) still scores as it did.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.slides import slide_sources

from federation.config import load_config
from federation.hospital.data import load_hospitals, to_tensor
from federation.launch import train
from inference.predict import predict
from inference.scoring import SlideTiles, plan_of, score_slide, summarise
from inference.slides import find_slides, read_slide
from models.bundle import load_bundle, read_card
from models.decision import FOCUS_CALL, NO_DESCRIPTION, UNFAMILIAR_CALL
from models.features import tile_statistics
from models.names import TISSUE_FILE
from models.shift import fit_description, write_description
from pipeline.config import build_config
from pipeline.images import encode_png
from pipeline.prepare import prepare_dataset
from pipeline.stain_profiles import StainProfile, apply_stain_profile
from pipeline.synth import generate_dataset
from pipeline.tiling import cut_square

# configs/prepare_site_shift.toml's hospital 1: an over-stained, bluish laboratory
OTHER_STAIN = StainProfile(hue=-15.0, stain_h=1.45, stain_e=0.85)


@pytest.fixture(scope="module")
def shift_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, dict]:
    """``(raw, prepared, run, prepare record)`` of the module docstring's run."""
    import json

    root = tmp_path_factory.mktemp("shift")
    raw, prepared, run = root / "raw", root / "prepared", root / "run"
    generate_dataset(raw, "seed", images=24, seed=4, size=384, tissue="gastric")
    prepare_dataset(
        build_config(
            None,
            {
                "source": {"format": "seed", "input": raw},
                "split": {"clients": 2, "sizes": "equal", "test_fraction": 0.3},
                "tiles": {"tile": 128, "stride": 64, "white_max": 0.4},
                "clients": {"grayscale": [1]},
                "output": {"out": prepared, "progress": False},
            },
        )
    )
    settings = ["run.rounds=2", "run.threads=1", "data.input_size=64", "data.batch_size=8",
                "data.eval_batch_size=64", "client.epochs=1", "strategy.name=fedavg"]  # fmt: skip
    train(load_config(None, settings, data=prepared), run, progress=False)
    record = json.loads((prepared / "prepare.json").read_text(encoding="utf-8"))
    return raw, prepared, run, record


def _test_images(raw: Path, record: dict, client: int) -> list[tuple[str, np.ndarray]]:
    sources = [s for label in ("normal", "abnormal") for s in slide_sources(record, client, "test", label)]
    return [(s, read_slide(find_slides(raw / s)[0]).image) for s in sources]


def _share(bundle_dir: Path, images: list[tuple[str, np.ndarray]]) -> tuple[float, int]:
    """The unfamiliar share of all the tiles of ``images`` (predict's tiling and scoring), and their count."""
    bundle = load_bundle(bundle_dir)
    assert bundle.tissue is not None, bundle.tissue_note
    flags = [score_slide(bundle, image, name).unfamiliar for name, image in images]
    assert all(f is not None for f in flags)
    stacked = np.concatenate([f for f in flags if f is not None])
    return float(stacked.mean()), int(stacked.size)


def _grey(image: np.ndarray) -> np.ndarray:
    return np.repeat(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[:, :, None], 3, axis=2)


def test_each_bundle_keeps_its_description_beside_the_weights(shift_run: tuple[Path, Path, Path, dict]) -> None:
    _, _, run, _ = shift_run
    for client in (0, 1):
        folder = run / "hospitals" / f"client_{client:02d}"
        bundle = load_bundle(folder)
        assert (folder / TISSUE_FILE).is_file()
        assert bundle.tissue is not None
        assert bundle.tissue_note == ""
        assert bundle.tissue.layer == "features.0"  # MobileNetV3-Small's stem
        assert bundle.tissue.round == read_card(folder).round == 2
        assert bundle.tissue.slides >= 5
        assert bundle.tissue.tiles > 100


def test_own_held_out_slides_are_at_most_5_percent_unfamiliar(shift_run: tuple[Path, Path, Path, dict]) -> None:
    raw, _, run, record = shift_run
    for client in (0, 1):
        share, tiles = _share(run / "hospitals" / f"client_{client:02d}", _test_images(raw, record, client))
        assert tiles > 50
        assert share <= 0.05, (client, share)


def test_another_hospitals_stain_is_at_least_90_percent_unfamiliar(shift_run: tuple[Path, Path, Path, dict]) -> None:
    raw, _, run, record = shift_run
    images = [(name, apply_stain_profile(image, OTHER_STAIN, False)) for name, image in _test_images(raw, record, 0)]
    share, _ = _share(run / "hospitals" / "client_00", images)
    assert share >= 0.90, share


def test_a_grey_scan_for_the_colour_model_is_reported_unfamiliar(
    shift_run: tuple[Path, Path, Path, dict], tmp_path: Path
) -> None:
    raw, _, run, record = shift_run
    images = _test_images(raw, record, 0)[:2]
    share, _ = _share(run / "hospitals" / "client_00", [(n, _grey(i)) for n, i in images])
    assert share >= 0.90, share
    slides = tmp_path / "slides"
    slides.mkdir()
    for name, image in images:
        (slides / f"grey_{name}").write_bytes(encode_png(_grey(image)))
    (slides / images[0][0]).write_bytes(encode_png(images[0][1]))  # and one slide as the hospital scans it
    results = predict(run / "hospitals" / "client_00", slides, tmp_path / "out", progress=False)
    by_name = {r.file.path.name: r.summary for r in results}
    for name, _ in images:
        grey = by_name[f"grey_{name}"]
        assert grey["unfamiliar"] is True
        assert grey["review"] is True
        assert grey["reported"] == UNFAMILIAR_CALL  # never a bare normal or abnormal
        assert grey["unfamiliar_share"] > 0.5
    own = by_name[images[0][0]]
    assert own["unfamiliar"] is False
    assert own["reported"] in ("normal", "abnormal", FOCUS_CALL)
    with (tmp_path / "out" / "summary.csv").open(newline="", encoding="utf-8") as handle:
        rows = {Path(r["file"]).name: r for r in csv.DictReader(handle)}
    assert rows[f"grey_{images[0][0]}"]["unfamiliar"] == "true"
    assert rows[f"grey_{images[0][0]}"]["reported"] == UNFAMILIAR_CALL
    assert float(rows[f"grey_{images[0][0]}"]["unfamiliar_share"]) > 0.5
    assert rows[images[0][0]]["unfamiliar"] == "false"
    tiles_csv = next((tmp_path / "out").glob(f"grey_{Path(images[0][0]).stem}*/tiles.csv"))
    marks = {r["tissue"] for r in csv.DictReader(tiles_csv.open(newline="", encoding="utf-8"))}
    assert "unfamiliar" in marks


def test_the_overlay_hatches_unfamiliar_tissue_grey(shift_run: tuple[Path, Path, Path, dict], tmp_path: Path) -> None:
    raw, _, run, record = shift_run
    name, image = _test_images(raw, record, 0)[0]
    slides = tmp_path / "slides"
    slides.mkdir()
    (slides / name).write_bytes(encode_png(_grey(image)))
    (result,) = predict(run / "hospitals" / "client_00", slides, tmp_path / "out", progress=False, threshold=0.999)
    assert result.folder is not None
    written = cv2.imread(str(result.folder / "overlay.png"))
    assert written is not None
    overlay = cv2.cvtColor(written, cv2.COLOR_BGR2RGB)
    grey_stripes = np.all(overlay == 128, axis=2)
    assert grey_stripes.mean() > 0.05  # the hatching's grey (a grey scan's own pixels are rarely exactly 128)
    assert result.summary["overlay"]["unfamiliar"].startswith("grey diagonal hatching")


def test_a_bundle_without_a_description_says_so_and_keeps_working(
    shift_run: tuple[Path, Path, Path, dict], tmp_path: Path
) -> None:
    raw, _, run, record = shift_run
    old = tmp_path / "old"
    shutil.copytree(run / "hospitals" / "client_00", old, ignore=shutil.ignore_patterns("checkpoints"))
    (old / TISSUE_FILE).unlink()
    bundle = load_bundle(old)
    assert bundle.tissue is None
    assert bundle.tissue_note.startswith(NO_DESCRIPTION)
    name, image = _test_images(raw, record, 0)[0]
    slides = tmp_path / "slides"
    slides.mkdir()
    (slides / name).write_bytes(encode_png(_grey(image)))
    (result,) = predict(old, slides, tmp_path / "out", progress=False)
    assert result.summary["unfamiliar_share"] is None
    assert result.summary["unfamiliar"] is False
    assert result.summary["tissue"].startswith(NO_DESCRIPTION)
    assert result.summary["reported"] in ("normal", "abnormal", FOCUS_CALL)
    with (tmp_path / "out" / "summary.csv").open(newline="", encoding="utf-8") as handle:
        (row,) = list(csv.DictReader(handle))
    assert row["unfamiliar_share"] == ""
    assert row["unfamiliar"] == ""
    # a damaged description is named, and the bundle still scores
    (old / TISSUE_FILE).write_bytes(b"not safetensors")
    damaged = load_bundle(old)
    assert damaged.tissue is None
    assert NO_DESCRIPTION in damaged.tissue_note
    assert str(old / TISSUE_FILE) in damaged.tissue_note


def test_a_normal_call_with_a_tile_above_the_threshold_is_a_focus_to_review(
    shift_run: tuple[Path, Path, Path, dict],
) -> None:
    # a constructed slide: one tile at 0.70 among nine at 0.05; the top-5 mean (0.18) calls it normal
    _, _, run, _ = shift_run
    card = read_card(run / "hospitals" / "client_00")
    probability = np.array([0.70] + [0.05] * 9)
    tiles = SlideTiles(
        xs=np.arange(10, dtype=np.int64) * 128,
        ys=np.zeros(10, dtype=np.int64),
        size=128,
        probability=probability,
        unfamiliar=np.zeros(10, dtype=bool),
    )
    summary = summarise(tiles, card, 0.5, 5, (128, 1280))
    assert summary["call"] == "normal"
    assert summary["focus"] is True
    assert summary["review"] is True
    assert summary["reported"] == FOCUS_CALL == "normal, with a focus above the threshold: review"
    # the same slide at a threshold above its top tile: a plain normal call
    plain = summarise(tiles, card, 0.75, 5, (128, 1280))
    assert plain["focus"] is False
    assert plain["reported"] == "normal"
    # mostly unfamiliar, it is UNFAMILIAR first (the focus is on tissue the model does not know)
    strange = SlideTiles(tiles.xs, tiles.ys, 128, probability, unfamiliar=np.arange(10) < 6)
    assert summarise(strange, card, 0.5, 5, (128, 1280))["reported"] == UNFAMILIAR_CALL


def test_a_slide_at_2x_magnification_is_reported_unfamiliar(shift_run: tuple[Path, Path, Path, dict]) -> None:
    raw, _, run, record = shift_run
    bundle = load_bundle(run / "hospitals" / "client_00")
    card = bundle.card
    for name, image in _test_images(raw, record, 0):
        enlarged = np.asarray(cv2.resize(image, None, fx=2.0, fy=2.0, interpolation=cv2.INTER_CUBIC), np.uint8)
        tiles = score_slide(bundle, enlarged, name)
        summary = summarise(tiles, card, card.threshold, 5, enlarged.shape[:2])
        assert summary["unfamiliar_share"] >= 0.90, (name, summary["unfamiliar_share"])
        assert summary["reported"] == UNFAMILIAR_CALL


def test_a_version_1_description_still_scores_as_it_did(
    shift_run: tuple[Path, Path, Path, dict], tmp_path: Path
) -> None:
    raw, prepared, run, record = shift_run
    old = tmp_path / "old"
    shutil.copytree(run / "hospitals" / "client_00", old, ignore=shutil.ignore_patterns("checkpoints"))
    bundle = load_bundle(old)
    assert bundle.tissue is not None
    assert (bundle.tissue.version, bundle.tissue.mean.size) == (3, 3 * 16 + 3)  # what an export writes now
    pre = bundle.card.preprocess
    data = load_hospitals(prepared, pre.input_size, pre.in_chans, [0])[0]
    assert data.train_units is not None
    # the description as the first version fitted it: the stem's 48 statistics, no scale ratios
    features = tile_statistics(bundle.model, "features.0", [to_tensor(data.train_x)])
    first = fit_description(features, list(data.train_units), "features.0", round=bundle.card.round, version=1)
    write_description(old, first)
    loaded = load_bundle(old)
    assert loaded.tissue is not None
    assert (loaded.tissue.version, loaded.tissue.scale, loaded.tissue.mean.size) == (1, False, 48)
    name, image = _test_images(raw, record, 0)[0]
    tiles = score_slide(loaded, _grey(image), name)
    assert tiles.distance is not None
    assert tiles.unfamiliar is not None
    plan = plan_of(loaded.card)
    grey = _grey(image)
    cut = np.stack([pre.fit(cut_square(grey, None, x, y, plan)) for x, y in zip(tiles.xs, tiles.ys, strict=True)])
    expected = first.distances(tile_statistics(loaded.model, "features.0", [pre.tensor(cut)]))
    np.testing.assert_allclose(tiles.distance, expected, rtol=1e-5)
    # tile by tile, as version 1 did: no neighbourhood
    assert tiles.unfamiliar.tolist() == (tiles.distance > first.threshold).tolist()
    assert tiles.unfamiliar.mean() >= 0.90
