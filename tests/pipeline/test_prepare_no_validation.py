"""A ``--val-fraction`` that leaves hospitals without a validation split says which (issue 48, part 5): 12 hospitals
of 2 slides get none at 0.3, and prepare named nobody; now one warning names them, in prepare.json and the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from support.seed_slides import config_for, make_seed

from pipeline.partition import no_validation, split_train_test
from pipeline.prepare import prepare_dataset


def test_twelve_hospitals_of_two_slides_are_named_for_having_no_validation_split(tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "out"
    make_seed(raw, n=24)  # 12 normal, 12 abnormal: 2 slides for each of 12 equal hospitals
    result = prepare_dataset(config_for(raw, out, split={"clients": 12, "val_fraction": 0.3}))
    expected = (
        "--val-fraction 0.3: 12 of 12 hospitals got no validation split (hospital 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, "
        "11; 2 slides each, and a validation split needs a third slide beside one for test and one for training): "
        "their thresholds from a sensitivity floor will be chosen on test, which is optimistic"
    )
    assert expected in result.warnings
    record = json.loads((out / "prepare.json").read_text(encoding="utf-8"))
    assert expected in record["warnings"]
    assert not [s for s in record["slides"] if s["split"] == "val"]  # indeed none: the warning is true
    assert expected in (out / "report.md").read_text(encoding="utf-8")


def test_only_the_hospitals_without_validation_are_named() -> None:
    # hospitals 0 and 2 hold 4 slides (1 test, 1 val, 2 train), hospital 1 holds 2 (1 test, 1 train)
    owners = [0, 0, 0, 0, 1, 1, 2, 2, 2, 2]
    labels = ["normal", "abnormal"] * 5
    splits = split_train_test(labels, owners, 3, 0.25, np.random.default_rng(0), val_fraction=0.25)
    assert splits[4:6].count("val") == 0
    assert splits[:4].count("val") == 1
    assert splits[6:].count("val") == 1
    assert no_validation(owners, splits, 3, 0.25) == (
        "--val-fraction 0.25: 1 of 3 hospitals got no validation split (hospital 1; 2 slides each, and a validation "
        "split needs a third slide beside one for test and one for training): their thresholds from a sensitivity "
        "floor will be chosen on test, which is optimistic"
    )
    assert no_validation(owners, splits, 3, 0.0) is None  # no validation asked for: nothing to say
    assert no_validation([0, 0, 0], ["train", "val", "test"], 1, 0.3) is None
