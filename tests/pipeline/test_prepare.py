"""End-to-end tests of `prepare_dataset` and `gastric-fl prepare` on tiny hand-built SEED/BOT/class-folder data.

The slides are 96x96 with a known white strip and known cancer masks, so every expectation below (labels,
white ratios, which pixels are whited out) can be computed from the fixture itself.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import tifffile
from support.checks import every
from support.images import file_hashes
from support.seed_slides import SIZE, TILE, config_for, make_bot, make_seed, outline_svg, read_manifest, tissue

from pipeline import prepare_tiling
from pipeline.errors import PipelineError
from pipeline.prepare import prepare_dataset
from pipeline.prepare_records import MANIFEST_COLUMNS


def imread(path: Path, flags: int = cv2.IMREAD_COLOR) -> np.ndarray:
    image = cv2.imread(str(path), flags)
    assert image is not None, path
    return np.asarray(image)


@pytest.fixture
def seed_raw(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    raw = tmp_path / "raw"
    return raw, make_seed(raw)


def _tissue_coverage(raw: Path, row: dict[str, str]) -> float:
    """The annotated share of a tile's tissue, recomputed from the raw slide and mask."""
    x, y, size = int(row["x"]), int(row["y"]), int(row["size"])
    original = cv2.cvtColor(imread(raw / row["source"]), cv2.COLOR_BGR2RGB)[y : y + size, x : x + size]
    mask = imread(raw / row["source"].replace(".png", "_mask.png"), cv2.IMREAD_GRAYSCALE)[y : y + size, x : x + size]
    tissue = original.min(axis=2) < 220
    return float((tissue & (mask > 0)).sum() / max(1, tissue.sum()))


def test_labels_regions_and_white_ratios_follow_the_masks(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    raw, truth = seed_raw
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out, tiles={"background_max": 0.3, "abnormal_coverage": 0.6}))
    rows = read_manifest(out)
    assert list(rows[0].keys()) == list(MANIFEST_COLUMNS)
    assert result.tiles == len(rows) > 0
    assert {r["label"] for r in rows} == {"normal", "abnormal"}
    for row in rows:
        assert row["label"] == truth[row["source"]]
        tile = cv2.cvtColor(imread(out / row["path"]), cv2.COLOR_BGR2RGB)
        x, y, size = int(row["x"]), int(row["y"]), int(row["size"])
        white = float((tile.min(axis=2) >= 220).mean())
        assert white == pytest.approx(float(row["white_ratio"]), abs=1e-6)
        assert white <= 0.3  # one white filter, on the raw tile, for both classes
        original = cv2.cvtColor(imread(raw / row["source"]), cv2.COLOR_BGR2RGB)[y : y + size, x : x + size]
        assert np.array_equal(tile, original)  # every tile raw, train and test
        if row["label"] == "abnormal":
            assert _tissue_coverage(raw, row) >= 0.6
    info = json.loads((out / "prepare.json").read_text())
    assert info["labels"]["mask_outside"] is False
    assert info["labels"]["departure"] is None
    assert info["config"]["tiles"]["abnormal_coverage"] == 0.6


def test_mask_outside_whitens_training_tiles_only_and_is_recorded(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out, tiles={"mask_outside": True, "white_max": 0.5}))
    rows = read_manifest(out)
    painted = {"train": 0, "val": 0, "test": 0}
    abnormal = {"train": 0, "val": 0, "test": 0}
    for row in (r for r in rows if r["label"] == "abnormal"):
        tile = cv2.cvtColor(imread(out / row["path"]), cv2.COLOR_BGR2RGB)
        x, y, size = int(row["x"]), int(row["y"]), int(row["size"])
        original = cv2.cvtColor(imread(raw / row["source"]), cv2.COLOR_BGR2RGB)[y : y + size, x : x + size]
        mask = imread(raw / row["source"].replace(".png", "_mask.png"), cv2.IMREAD_GRAYSCALE)
        inside = mask[y : y + size, x : x + size] > 0
        abnormal[row["split"]] += 1
        if row["split"] != "train":
            assert np.array_equal(tile, original)  # validation and test tiles are never masked
            assert _tissue_coverage(raw, row) >= 0.5
        else:
            assert (tile[~inside] == 255).all()  # Step a.1 on training tiles
            assert np.array_equal(tile[inside], original[inside])
            painted["train"] += int((~inside).any())
    assert abnormal["train"] > 0
    assert abnormal["test"] > 0
    assert painted["train"] > 0
    info = json.loads((out / "prepare.json").read_text())
    assert info["labels"]["mask_outside"] is True
    assert "Step a.1" in info["labels"]["departure"]
    assert "DEPARTURE" in (out / "report.md").read_text()


def test_no_slide_in_both_splits_and_every_client_has_both(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out, split={"clients": 3, "test_fraction": 0.3}))
    rows = read_manifest(out)
    splits_of: dict[str, set[str]] = {}
    clients_of: dict[str, set[str]] = {}
    for row in rows:
        splits_of.setdefault(row["source"], set()).add(row["split"])
        clients_of.setdefault(row["source"], set()).add(row["client"])
        assert row["path"].startswith(f"client_{int(row['client']):02d}/{row['split']}/{row['label']}/")
    assert every(len(s) == 1 for s in splits_of.values())
    assert every(len(c) == 1 for c in clients_of.values())
    for client in ("0", "1", "2"):
        assert {r["split"] for r in rows if r["client"] == client} == {"train", "val", "test"}


def test_grayscale_clients_store_single_channel_tiles(seed_raw: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out, split={"clients": 3}, clients={"grayscale": [0, 2]}))
    rows = read_manifest(out)
    assert {r["client"] for r in rows} == {"0", "1", "2"}
    for row in rows:
        tile = imread(out / row["path"], cv2.IMREAD_UNCHANGED)
        gray = row["client"] in ("0", "2")
        assert row["channels"] == ("1" if gray else "3")
        assert tile.ndim == (2 if gray else 3)
    info = json.loads((out / "prepare.json").read_text())
    assert [c["grayscale"] for c in info["clients"]] == [True, False, True]


def test_hospital_sizes_follow_the_requested_ratio(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_seed(raw, n=24)
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out, split={"clients": 3, "sizes": "3,2,1"}))
    info = json.loads((out / "prepare.json").read_text())
    slides = [sum(c["slides"].values()) for c in info["clients"]]
    assert slides == [12, 8, 4]
    per_client = {str(c): {s["source"] for s in info["slides"] if s["client"] == c} for c in range(3)}
    manifest_sources = {c: {r["source"] for r in read_manifest(out) if r["client"] == c} for c in per_client}
    assert manifest_sources == per_client


def test_same_inputs_and_seed_give_identical_bytes_and_raw_is_untouched(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    raw, _ = seed_raw
    before = file_hashes(raw)
    split = {"clients": 3, "sizes": "random", "partition": "dirichlet:0.5"}
    gray = {"grayscale": [1]}
    prepare_dataset(config_for(raw, tmp_path / "a", split=split, clients=gray))
    # One worker instead of two: thread scheduling must not change a byte.
    prepare_dataset(config_for(raw, tmp_path / "b", split=split, clients=gray, output={"workers": 1}))
    first, second = file_hashes(tmp_path / "a"), file_hashes(tmp_path / "b")
    assert first == second
    assert file_hashes(raw) == before
    prepare_dataset(config_for(raw, tmp_path / "c", split={**split, "seed": 7}, clients=gray))
    assert file_hashes(tmp_path / "c")["manifest.csv"] != first["manifest.csv"]


def test_manifest_xy_size_trace_back_to_original_pixels_for_scaled_clients(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    prepare_dataset(
        config_for(
            raw, out, tiles={"background_max": 0.7, "white_max": 0.7}, clients={"scale": [1.0, 0.5], "tile": [32, 16]}
        )
    )
    rows = read_manifest(out)
    scaled = [r for r in rows if r["client"] == "1"]
    assert scaled
    for row in scaled:
        x, y, size = int(row["x"]), int(row["y"]), int(row["size"])
        assert size == 32  # 16 px at half resolution cover 32 original pixels
        tile = imread(out / row["path"])
        assert tile.shape == (16, 16, 3)
        if row["label"] == "normal":
            original = imread(raw / row["source"])[y : y + size, x : x + size]
            assert np.array_equal(tile, cv2.resize(original, (16, 16), interpolation=cv2.INTER_AREA))
    info = json.loads((out / "prepare.json").read_text())
    assert [(c["tile_px"], c["scale"], c["source_px"]) for c in info["clients"]] == [(32, 1.0, 32), (16, 0.5, 32)]


def test_prepare_json_records_config_hashes_counts_and_versions(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out))
    info = json.loads((out / "prepare.json").read_text())
    assert info["config"]["tiles"]["tile"] == TILE
    assert info["source_sha256"]["s03_mask.png"] == hashlib.sha256((raw / "s03_mask.png").read_bytes()).hexdigest()
    assert set(info["versions"]) >= {"python", "numpy", "opencv", "gastric-fl"}
    rows = read_manifest(out)
    assert [c["client"] for c in info["clients"]] == [0, 1]
    for c in info["clients"]:
        for split in ("train", "test"):
            for label in ("normal", "abnormal"):
                expected = sum(
                    1 for r in rows if (r["client"], r["split"], r["label"]) == (str(c["client"]), split, label)
                )
                assert c["tiles"][split][label] == expected
    report = (out / "report.md").read_text()
    assert "| all |" in report
    sheet = imread(out / "contact_sheet.png")
    assert sheet is not None
    assert sheet.shape[0] > 2 * 96


def test_existing_output_needs_overwrite_and_foreign_folders_are_never_replaced(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    prepare_dataset(config_for(raw, out))
    with pytest.raises(PipelineError, match="already exists; pass --overwrite"):
        prepare_dataset(config_for(raw, out))
    prepare_dataset(config_for(raw, out, split={"clients": 3}, output={"overwrite": True}))
    assert len(json.loads((out / "prepare.json").read_text())["clients"]) == 3
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"not ours")
    with pytest.raises(PipelineError, match="was not made by gastric-fl prepare"):
        prepare_dataset(config_for(raw, foreign, output={"overwrite": True}))
    assert (foreign / "holiday.jpg").read_bytes() == b"not ours"
    with pytest.raises(PipelineError, match="overlap"):
        prepare_dataset(config_for(raw, raw / "prepared"))
    made_beforehand = tmp_path / "empty"
    made_beforehand.mkdir()
    prepare_dataset(config_for(raw, made_beforehand))  # an empty folder is filled without --overwrite
    assert (made_beforehand / "manifest.csv").is_file()


def test_an_interrupted_run_leaves_no_dataset_and_keeps_the_previous_one(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    calls = {"n": 0}
    real = prepare_tiling.encode_png

    def failing(tile: np.ndarray) -> bytes:
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real(tile)

    monkeypatch.setattr(prepare_tiling, "encode_png", failing)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(config_for(raw, out, output={"workers": 1}))
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["raw"]  # no partial folder left behind

    monkeypatch.setattr(prepare_tiling, "encode_png", real)
    prepare_dataset(config_for(raw, out))
    before = file_hashes(out)
    calls["n"] = 0
    monkeypatch.setattr(prepare_tiling, "encode_png", failing)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(config_for(raw, out, split={"clients": 3}, output={"overwrite": True, "workers": 1}))
    assert file_hashes(out) == before


# --- bad input: each case gets its documented behaviour (docs/pipeline.md, "Bad input") -------------------------


def _skipped(out: Path) -> dict[str, str]:
    return {s["source"]: s["reason"] for s in json.loads((out / "prepare.json").read_text())["skipped"]}


@pytest.mark.parametrize(
    ("case", "damage", "reason"),
    [
        ("corrupt image", lambda raw: (raw / "s04.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage"), "cannot decode"),
        (
            "truncated image",
            lambda raw: (raw / "s04.png").write_bytes((raw / "s04.png").read_bytes()[:200]),
            "cannot decode",
        ),
        (
            "mask size mismatch",
            lambda raw: cv2.imwrite(str(raw / "s04_mask.png"), np.zeros((SIZE, SIZE + 8), np.uint8)),
            "mask is 104x96 but its slide",
        ),
        ("missing mask", lambda raw: (raw / "s04_mask.png").unlink(), "no mask found"),
        (
            "non-binary mask",
            lambda raw: cv2.imwrite(str(raw / "s04_mask.png"), np.tile(np.arange(SIZE, dtype=np.uint8), (SIZE, 1))),
            "mask is not binary",
        ),
    ],
)
def test_bad_seed_slides_are_skipped_and_reported_or_stop_with_strict(
    seed_raw: tuple[Path, dict[str, str]], tmp_path: Path, case: str, damage: object, reason: str
) -> None:
    raw, _ = seed_raw
    damage(raw)  # type: ignore[operator]
    before = file_hashes(raw)
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out))
    assert [s.source for s in result.skipped] == ["s04.png"], case
    assert reason in _skipped(out)["s04.png"]
    assert "s04.png" not in {r["source"] for r in read_manifest(out)}
    assert reason in (out / "report.md").read_text()
    assert reason in result.report
    with pytest.raises(PipelineError, match=reason):
        prepare_dataset(config_for(raw, tmp_path / "strict", output={"strict": True}))
    assert not (tmp_path / "strict").exists()
    assert file_hashes(raw) == before


def test_a_non_binary_mask_is_accepted_with_a_threshold(seed_raw: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    raw, _ = seed_raw
    ramp = np.tile(np.arange(SIZE, dtype=np.uint8), (SIZE, 1))  # value = column index
    cv2.imwrite(str(raw / "s04_mask.png"), ramp)
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out, source={"mask_threshold": 63}, tiles={"abnormal_coverage": 1.0}))
    assert not result.skipped
    rows = [r for r in read_manifest(out) if r["source"] == "s04.png"]
    # Cancer = columns 64..95: exactly the tiles starting at x=64 have all their tissue inside it.
    assert rows
    assert {(r["label"], r["x"]) for r in rows} == {("abnormal", "64")}


def test_masks_in_a_masks_folder_and_custom_suffix_are_found(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    truth = make_seed(raw, n=8)
    (raw / "masks").mkdir()
    for k in range(8):
        if k % 2:
            (raw / f"s{k:02d}_mask.png").rename(raw / "masks" / f"s{k:02d}.png")
        else:
            (raw / f"s{k:02d}_mask.png").rename(raw / f"s{k:02d}-gt.png")
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out, source={"mask_suffix": "-gt"}))
    assert not result.skipped
    assert {r["source"]: r["label"] for r in read_manifest(out)} == truth


def test_bot_layout_outline_svgs_with_transforms_give_the_region(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_bot(raw)
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out, "bot", tiles={"abnormal_coverage": 1.0}))
    assert not result.skipped
    assert not result.warnings
    abnormal = [r for r in read_manifest(out) if r["label"] == "abnormal"]
    # Region = x 30..90, y 8..78 (the polygon translated by (30, 8)). On the abnormal grid (step 16, half the
    # tile) 32 px squares whose tissue is all inside it fit at x in {32, 48} and y in {16, 32}.
    assert {(r["x"], r["y"]) for r in abnormal} == {("32", "16"), ("32", "32"), ("48", "16"), ("48", "32")}
    assert {r["source"].split("/")[0] for r in read_manifest(out)} == {"normal", "abnormal"}


def test_bad_bot_annotations_are_skipped_clipped_or_reported(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_bot(raw)
    (raw / "abnormal" / "b00.svg").write_text("<svg><polygon points='0,0 5,0'")  # malformed XML
    (raw / "abnormal" / "b01.svg").write_text(outline_svg("50,40 200,40 200,200 50,200"))  # reaches outside: clipped
    (raw / "abnormal" / "b02.svg").write_text(outline_svg("200,200 300,200 300,300"))  # entirely outside
    (raw / "abnormal" / "b03.svg").unlink()  # missing annotation
    before = file_hashes(raw)
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out, "bot"))
    skipped = _skipped(out)
    assert set(skipped) == {"abnormal/b00.tiff", "abnormal/b02.tiff", "abnormal/b03.tiff"}
    assert "abnormal/b00.svg: malformed SVG" in skipped["abnormal/b00.tiff"]
    assert "enclose no pixel inside" in skipped["abnormal/b02.tiff"]
    assert "has no annotation b03.svg" in skipped["abnormal/b03.tiff"]
    assert len(result.warnings) == 1
    assert "abnormal/b01.svg: annotation reaches outside" in result.warnings[0]
    clipped = [r for r in read_manifest(out) if r["source"] == "abnormal/b01.tiff"]
    assert clipped
    assert every(int(r["x"]) >= 32 and int(r["y"]) >= 32 for r in clipped)
    assert file_hashes(raw) == before
    with pytest.raises(PipelineError, match="malformed SVG"):
        prepare_dataset(config_for(raw, tmp_path / "strict", "bot", output={"strict": True}))


def test_truncated_tiffs_are_caught_from_the_header_and_corrupt_pixels_while_tiling(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_bot(raw)
    rng = np.random.default_rng(5)
    corrupt = raw / "normal" / "b01.tiff"
    tifffile.imwrite(corrupt, tissue(rng), photometric="rgb", compression="zlib", rowsperstrip=SIZE)
    with tifffile.TiffFile(corrupt) as tif:
        offset = int(tif.pages.first.dataoffsets[0])
    data = bytearray(corrupt.read_bytes())
    data[offset : offset + 64] = bytes(64)  # header intact, deflate stream destroyed
    corrupt.write_bytes(bytes(data))
    truncated = raw / "normal" / "b00.tiff"
    truncated.write_bytes(truncated.read_bytes()[: SIZE * SIZE])
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out, "bot"))
    skipped = _skipped(out)
    assert set(skipped) == {"normal/b00.tiff", "normal/b01.tiff"}
    assert "truncated" in skipped["normal/b00.tiff"]
    assert "cannot decode image" in skipped["normal/b01.tiff"]
    assert "found while tiling" in skipped["normal/b01.tiff"]
    assert [s.source for s in result.skipped] == ["normal/b00.tiff", "normal/b01.tiff"]
    info = json.loads((out / "prepare.json").read_text())
    assert "normal/b01.tiff" not in {s["source"] for s in info["slides"]}
    assert info["totals"]["slides"] == 8


def test_class_folders_keep_their_labels_and_too_small_images_are_reported(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    rng = np.random.default_rng(2)
    for label in ("normal", "abnormal"):
        (raw / label).mkdir(parents=True)
        for k in range(4):
            cv2.imwrite(str(raw / label / f"c{k}.jpg"), cv2.cvtColor(tissue(rng), cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(raw / "normal" / "tiny.png"), np.full((20, 20, 3), 120, np.uint8))
    out = tmp_path / "prepared"
    result = prepare_dataset(config_for(raw, out, "class-folders"))
    rows = read_manifest(out)
    assert rows
    assert every(r["source"].startswith(r["label"] + "/") for r in rows)
    assert "normal/tiny.png" not in {r["source"] for r in rows}
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith("normal/tiny.png: 20x20 is smaller than client ")
    info = json.loads((out / "prepare.json").read_text())
    assert info["totals"]["slides_without_tiles"] == 1


def test_empty_input_and_client_without_a_split_stop_with_clear_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PipelineError, match="holds no slides in the seed layout"):
        prepare_dataset(config_for(empty, tmp_path / "out"))
    with pytest.raises(PipelineError, match="does not exist"):
        prepare_dataset(config_for(tmp_path / "missing", tmp_path / "out"))
    raw = tmp_path / "raw"
    make_seed(raw, n=4)
    # Every tile has the white strip or whited-out tissue above 0 %: no tile passes, so no client has any split.
    with pytest.raises(PipelineError, match="client 0 has no train tiles"):
        prepare_dataset(config_for(raw, tmp_path / "out", tiles={"white_max": 0.0, "background_max": 0.0, "tile": 96}))
    with pytest.raises(PipelineError, match="cannot supply 3 clients"):
        prepare_dataset(config_for(raw, tmp_path / "out", split={"clients": 3}))
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "prepare", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )


def test_cli_prepares_and_prints_the_report(seed_raw: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    raw, _ = seed_raw
    out = tmp_path / "prepared"
    preset = tmp_path / "preset.toml"
    preset.write_text('[split]\nclients = 2\nsizes = "equal"\n[tiles]\ntile = 32\n')
    done = _cli(
        "--input", str(raw), "--out", str(out), "--config", str(preset), "--grayscale-clients", "1", "--no-progress"
    )
    assert done.returncode == 0, done.stderr
    assert "train normal" in done.stdout
    assert f"to {out}" in done.stdout
    info = json.loads((out / "prepare.json").read_text())
    assert info["config"]["clients"]["grayscale"] == [1]
    assert info["config"]["tiles"]["tile"] == 32
    failed = _cli("--input", str(raw), "--out", str(out), "--no-progress")
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == [
        f"error: output folder {out} already exists; pass --overwrite to replace it or choose another --out"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--input", "{tmp}/nope", "--out", "{tmp}/o"), "does not exist"),
        (("--input", "{raw}", "--out", "{tmp}/o", "--partition", "weird"), "partition 'weird' is not understood"),
        (("--input", "{raw}", "--out", "{tmp}/o", "--clients", "3", "--grayscale-clients", "5"), "must be in 0..2"),
        (("--input", "{raw}", "--out", "{tmp}/o", "--sizes", "3,2"), "--sizes '3,2' must be"),
        (("--input", "{raw}", "--out", "{tmp}/o", "--config", "{tmp}/none.toml"), "config file"),
        (
            (
                "--out",
                "{tmp}/o",
            ),
            "--input is required",
        ),
    ],
)
def test_cli_errors_are_one_line_with_exit_code_2(
    seed_raw: tuple[Path, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    message: str,
) -> None:
    from app.cli import main

    raw, _ = seed_raw
    argv = [a.format(tmp=tmp_path, raw=raw) for a in args]
    monkeypatch.setattr(sys, "argv", ["gastric-fl", "prepare", *argv, "--no-progress"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert not (tmp_path / "o").exists()
