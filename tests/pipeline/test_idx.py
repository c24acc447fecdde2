"""IDX image sets (`pipeline.idx`, `prepare --format idx`): the reader on hand-made files (exact pixels and labels),
refusals of truncated, missing and unpaired files, the merge order and PFLlib's partition through prepare, and
Fashion-MNIST as Debian's package dataset-fashion-mnist installs it (scripts/test.sh installs the package; the
test fails, saying so, where it is absent)."""

from __future__ import annotations

import csv
import gzip
import json
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.cli import run_cli

from pipeline.idx import FASHION_MNIST_DIR, IdxError, image_sets, load_set, parse_idx, read_idx, write_subset
from pipeline.idx import idx_bytes as written_idx


def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """An IDX file by the format's definition: 0, 0, type code, number of dimensions, sizes (big-endian), data."""
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_set(folder: Path, name: str, images: np.ndarray, labels: np.ndarray, gz: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
        data = idx_bytes(array.astype(np.uint8))
        (folder / f"{name}-{kind}-ubyte{ext}").write_bytes(gzip.compress(data, mtime=0) if gz else data)


def test_reader_on_a_hand_made_file_gives_exact_pixels_and_labels(tmp_path: Path) -> None:
    # two 2 x 3 images, written byte by byte: magic 00 00 08 03, sizes 2, 2, 3, then 12 pixels
    raw = bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3, *range(0, 120, 10)])
    (tmp_path / "x-images-idx3-ubyte").write_bytes(raw)
    (tmp_path / "x-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 2, 7, 3])))
    pixels = read_idx(tmp_path / "x-images-idx3-ubyte")
    assert pixels.dtype == np.uint8
    assert pixels.tolist() == [[[0, 10, 20], [30, 40, 50]], [[60, 70, 80], [90, 100, 110]]]
    assert read_idx(tmp_path / "x-labels-idx1-ubyte.gz").tolist() == [7, 3]
    # big-endian multi-byte elements: 16-bit -2 and 258 are ff fe and 01 02
    assert parse_idx(bytes([0, 0, 0x0B, 1, 0, 0, 0, 2, 0xFF, 0xFE, 1, 2]), "s").tolist() == [-2, 258]
    (only,) = image_sets(tmp_path)
    images, labels = load_set(only)
    assert images.shape == (2, 2, 3)
    assert labels.tolist() == [7, 3]


def test_truncated_corrupt_missing_and_unpaired_files_are_refused_by_name(tmp_path: Path) -> None:
    whole = idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
    short = tmp_path / "short-images-idx3-ubyte"
    short.write_bytes(whole[:-1])
    with pytest.raises(IdxError, match=rf"{short}: IDX header declares 2x3x4 elements .* holds 39 bytes; .*truncated"):
        read_idx(short)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(whole)[:-6])
    with pytest.raises(IdxError, match=rf"{cut}: not a complete gzip file"):
        read_idx(cut)
    with pytest.raises(IdxError, match="not an IDX file \\(its magic number is 89504e47"):
        parse_idx(b"\x89PNG\r\n\x1a\n", "fake")
    with pytest.raises(IdxError, match=rf"{tmp_path / 'gone'}: no such IDX file"):
        read_idx(tmp_path / "gone")
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "a-images-idx3-ubyte").write_bytes(whole)
    with pytest.raises(IdxError, match="a-images-idx3-ubyte: no labels file a-labels-idx1-ubyte"):
        image_sets(lone)
    write_set(tmp_path / "mismatch", "m", np.zeros((3, 8, 8)), np.zeros(2))
    with pytest.raises(IdxError, match="2 labels for the 3 images"):
        load_set(image_sets(tmp_path / "mismatch")[0])


def test_the_writer_is_the_readers_inverse_and_a_subset_keeps_the_first_images(tmp_path: Path) -> None:
    values = np.array([[-2, 258, 7]], dtype=np.int16)
    assert written_idx(values) == idx_bytes(values, code=0x0B)  # the format's bytes, written by hand above
    assert parse_idx(written_idx(values), "w").tolist() == [[-2, 258, 7]]
    rng = np.random.default_rng(5)
    train, t10k = rng.integers(0, 256, (9, 8, 8)), rng.integers(0, 256, (4, 8, 8))
    write_set(tmp_path / "full", "train", train, np.arange(9) % 3)
    write_set(tmp_path / "full", "t10k", t10k, np.array([2, 1, 0, 2]))
    write_subset(tmp_path / "full", tmp_path / "sub", {"train": 5, "t10k": 2})
    (first, second) = image_sets(tmp_path / "sub")
    assert [s.name for s in (first, second)] == ["train", "t10k"]
    assert np.array_equal(load_set(first)[0], train[:5])
    assert load_set(first)[1].tolist() == [0, 1, 2, 0, 1]
    assert np.array_equal(load_set(second)[0], t10k[:2])
    assert load_set(second)[1].tolist() == [2, 1]
    with pytest.raises(IdxError, match="has no image set 'test'; its sets are train, t10k"):
        write_subset(tmp_path / "full", tmp_path / "other", {"test": 1})
    with pytest.raises(IdxError, match="t10k: 5 images asked for, it holds 4"):
        write_subset(tmp_path / "full", tmp_path / "other2", {"t10k": 5})


def test_prepare_without_the_files_exits_2_with_one_line_naming_path_and_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "fashion-mnist"
    args = ["prepare", "--format", "idx", "--input", str(absent), "--out", str(tmp_path / "out"), "--no-progress"]
    assert run_cli(monkeypatch, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert str(absent) in err[0]
    assert "apt-get install -y dataset-fashion-mnist" in err[0]
    assert not (tmp_path / "out").exists()
    absent.mkdir()  # a folder without IDX files: the same advice
    assert run_cli(monkeypatch, *args) == 2
    assert "holds no IDX image set" in capsys.readouterr().err


def test_prepare_merges_train_first_and_partitions_as_pfllib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    train = rng.integers(0, 256, (18, 8, 8))
    t10k = rng.integers(0, 256, (6, 8, 8))
    raw = tmp_path / "raw"
    write_set(raw, "train", train, np.repeat([0, 1, 2], 6))
    write_set(raw, "t10k", t10k, np.array([0, 0, 1, 1, 2, 2]), gz=False)
    before = {p.name: p.read_bytes() for p in raw.iterdir()}
    out = tmp_path / "prepared"
    args = ["prepare", "--format", "idx", "--input", str(raw), "--out", str(out), "--clients", "6"]
    args += ["--partition", "pat-balanced:2", "--tile", "8", "--background-max", "1", "--test-fraction", "0.25"]
    args += ["--val-fraction", "0.2", "--seed", "1", "--no-progress"]
    assert run_cli(monkeypatch, *args) == 0
    assert {p.name: p.read_bytes() for p in raw.iterdir()} == before
    with (out / "manifest.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    sources = {c: sorted(r["source"] for r in rows if r["client"] == str(c)) for c in range(6)}
    # merged order train 0-17, then t10k 18-23; class 0 = train 0-5, t10k 0-1. pat-balanced:2 over 6 clients:
    # classes 0 and 1 go 2 each to clients 0-3 in that order, class 2 4 each to clients 4 and 5
    assert sources[0] == [f"train-images-idx3-ubyte.gz#{k:02d}" for k in (0, 1, 6, 7)]
    assert sources[3] == [f"t10k-images-idx3-ubyte#{k}" for k in range(4)]
    assert sources[5] == [
        "t10k-images-idx3-ubyte#4",
        "t10k-images-idx3-ubyte#5",
        "train-images-idx3-ubyte.gz#16",
        "train-images-idx3-ubyte.gz#17",
    ]
    info = json.loads((out / "prepare.json").read_text())
    assert info["classes"] == ["0", "1", "2"]
    assert info["config"]["split"]["partition"] == "pat-balanced:2"
    # 4 images each: floor(0.75 * 4) = 3 train, 1 test; round(0.2 * 4) = 1 of the train to validation
    for client in info["clients"]:
        assert client["slides"] == {"train": 2, "val": 1, "test": 1}
    # sizes follow from PFLlib's draws (4 images each: ratio 4/24), not from --sizes
    assert (
        "| sizes | drawn by PFLlib's partition (ratios 0.17, 0.17, 0.17, 0.17, 0.17, 0.17) |"
        in (out / "report.md").read_text()
    )
    # a tile is the image itself, grey stored as three equal channels
    row = next(r for r in rows if r["source"] == "t10k-images-idx3-ubyte#2")
    assert row["label"] == "1"
    tile = cv2.imread(str(out / row["path"]), cv2.IMREAD_UNCHANGED)
    assert tile is not None
    assert tile.shape == (8, 8, 3)
    for channel in range(3):
        assert np.array_equal(tile[:, :, channel], t10k[2])


def test_fashion_mnist_from_the_debian_package() -> None:
    if not FASHION_MNIST_DIR.is_dir():
        pytest.fail(
            f"{FASHION_MNIST_DIR} is missing: install Debian's package dataset-fashion-mnist "
            "(scripts/test.sh does: bash scripts/apt_install.sh dataset-fashion-mnist ...)"
        )
    train, t10k = image_sets(FASHION_MNIST_DIR)
    assert (train.name, t10k.name) == ("train", "t10k")
    images, labels = load_set(train)
    assert images.shape == (60000, 28, 28)
    assert labels[:6].tolist() == [9, 0, 0, 3, 0, 2]
    assert images[0, 10, 10:16].tolist() == [0, 0, 0, 193, 228, 218]
    test_images, test_labels = load_set(t10k)
    assert test_images.shape == (10000, 28, 28)
    assert np.bincount(np.concatenate([labels, test_labels])).tolist() == [7000] * 10
