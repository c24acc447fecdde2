"""Class-folders datasets with any number of classes, and scikit-learn's digits exported to that layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from sklearn.datasets import load_digits
from support.images import file_hashes

from pipeline.config import build_config
from pipeline.digits import digit_pixels, export_digits
from pipeline.errors import PipelineError
from pipeline.prepare import prepare_dataset
from pipeline.sources import dataset_classes


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits") / "raw"
    export_digits(out, size=16)
    return out


def test_digits_export_matches_sklearn_per_class_and_pixel(digits: Path, tmp_path: Path) -> None:
    data = load_digits()
    expected = {str(c): int(n) for c, n in enumerate(np.bincount(data.target))}
    written = {d.name: len(list(d.glob("*.png"))) for d in digits.iterdir() if d.is_dir()}
    assert written == expected
    assert sum(written.values()) == 1797
    info = json.loads((digits / "synth.json").read_text())
    assert info["counts"] == expected
    assert info["classes"] == [str(c) for c in range(10)]
    # Image k is sklearn's image k, enlarged by nearest neighbour: every 2x2 block holds one original value.
    image = cv2.imread(str(digits / f"{data.target[5]}/digit_0005.png"), cv2.IMREAD_UNCHANGED)
    assert image.shape == (16, 16)
    assert np.array_equal(image[::2, ::2], np.rint(data.images[5] * 255 / 16).astype(np.uint8))
    assert np.array_equal(digit_pixels(data.images[5], 16), image)
    # Deterministic: a second export is byte-identical.
    export_digits(tmp_path / "again", size=16)
    assert file_hashes(tmp_path / "again") == file_hashes(digits)
    with pytest.raises(PipelineError, match="multiple of 8"):
        export_digits(tmp_path / "bad", size=20)


def test_class_order_is_natural_and_binary_folders_keep_normal_first(tmp_path: Path) -> None:
    from pipeline.config import SourceConfig

    for names in (["10", "2", "1"], ["class_b", "Class_a"]):
        root = tmp_path / "_".join(names)
        for name in names:
            (root / name).mkdir(parents=True)
            cv2.imwrite(str(root / name / "x.png"), np.zeros((8, 8), np.uint8))
        (root / "empty").mkdir()  # a folder without images is not a class
        (root / ".hidden").mkdir()
        found = dataset_classes(SourceConfig(format="class-folders", input=root))
        assert found == (("1", "2", "10") if names[0] == "10" else ("Class_a", "class_b"))
    binary = tmp_path / "binary"
    for name in ("abnormal", "normal"):
        (binary / name).mkdir(parents=True)
        cv2.imwrite(str(binary / name / "x.png"), np.zeros((8, 8), np.uint8))
    assert dataset_classes(SourceConfig(format="class-folders", input=binary)) == ("normal", "abnormal")
    bad = tmp_path / "bad"
    (bad / "a b").mkdir(parents=True)
    cv2.imwrite(str(bad / "a b" / "x.png"), np.zeros((8, 8), np.uint8))
    with pytest.raises(PipelineError, match="cannot be a label"):
        dataset_classes(SourceConfig(format="class-folders", input=bad))


def test_prepare_ten_classes_manifest_and_prepare_json(digits: Path, tmp_path: Path) -> None:
    before = file_hashes(digits)
    out = tmp_path / "prepared"
    config = build_config(
        None,
        {
            "source": {"format": "class-folders", "input": digits},
            "split": {"clients": 10, "sizes": "equal", "partition": "classes:3", "seed": 0},
            "tiles": {"tile": 16, "background_max": 1.0},
            "clients": {"grayscale": [9]},
            "sites": {"shift": "random"},
            "output": {"out": out},
        },
    )
    result = prepare_dataset(config)
    assert result.tiles == 1797
    assert file_hashes(digits) == before
    info = json.loads((out / "prepare.json").read_text())
    classes = [str(c) for c in range(10)]
    assert info["classes"] == classes
    assert list(info["totals"]["by_label"]) == classes
    assert info["totals"]["by_label"] == json.loads((digits / "synth.json").read_text())["counts"]
    with (out / "manifest.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["label"] for r in rows} == set(classes)
    for row in rows:
        assert row["source"].split("/")[0] == row["label"]
        assert row["path"].split("/")[2] == row["label"]
    # classes:3 over 10 classes: client c holds classes c, c+1, c+2 (mod 10), and nothing else.
    for client in range(10):
        held = {int(r["label"]) for r in rows if r["client"] == str(client)}
        assert held == {(client + k) % 10 for k in range(3)}
    assert len(info["clients"]) == 10
    for client, by_split in enumerate(info["clients"]):
        assert list(by_split["tiles"]["train"]) == classes
        assert by_split["site"] is not None
        assert by_split["channels"] == (1 if client == 9 else 3)


def test_multiclass_settings_are_checked(digits: Path, tmp_path: Path) -> None:
    def run(source: dict[str, object], split: dict[str, object] | None = None) -> None:
        prepare_dataset(
            build_config(
                None,
                {
                    "source": {"format": "class-folders", "input": digits, **source},
                    "split": {"clients": 2, **(split or {})},
                    "tiles": {"tile": 16},
                    "output": {"out": tmp_path / "out"},
                },
            )
        )

    with pytest.raises(PipelineError, match="classes:11 asks for more classes per client than the 10"):
        run({}, {"partition": "classes:11"})
    with pytest.raises(PipelineError, match=r"classes:4 with 2 client\(s\) leaves no client holding '5' slides"):
        run({}, {"partition": "classes:4"})
    with pytest.raises(PipelineError, match=r"class folder .*/12 does not exist"):
        run({"classes": ["1", "12"]})
    with pytest.raises(PipelineError, match=r"source\.classes applies to --format class-folders only"):
        build_config(None, {"source": {"format": "seed", "classes": ["a", "b"]}})
    with pytest.raises(PipelineError, match="lists a class twice"):
        build_config(None, {"source": {"format": "class-folders", "classes": ["a", "a"]}})


def test_listed_classes_pick_and_order_the_folders(digits: Path, tmp_path: Path) -> None:
    out = tmp_path / "three"
    prepare_dataset(
        build_config(
            None,
            {
                "source": {"format": "class-folders", "input": digits, "classes": ["7", "1", "3"]},
                "split": {"clients": 2, "sizes": "equal"},
                "tiles": {"tile": 16, "background_max": 1.0},
                "output": {"out": out},
            },
        )
    )
    info = json.loads((out / "prepare.json").read_text())
    assert info["classes"] == ["7", "1", "3"]
    assert info["totals"]["by_label"] == {"7": 179, "1": 182, "3": 183}
