"""Client sizes, label partitions and the per-slide train/test split (`pipeline.partition`), on unequal inputs."""

from __future__ import annotations

import numpy as np
import pytest
from support.checks import every

from pipeline.config import Partition, SplitConfig, parse_partition
from pipeline.errors import PipelineError
from pipeline.partition import (
    _test_quota,
    assign_hospitals,
    hospital_sizes,
    largest_remainder,
    split_train_test,
)


def _labels(normal: int, abnormal: int) -> list[str]:
    return ["normal"] * normal + ["abnormal"] * abnormal


def test_largest_remainder_by_hand() -> None:
    # 10 * (3, 2, 1) / 6 = 5, 3.33, 1.67 -> floors 5, 3, 1 (9); the largest remainder (0.67) gets the last one.
    assert largest_remainder([3, 2, 1], 10) == [5, 3, 2]
    # 7 * (1, 1, 1) / 3 = 2.33 each: ties go to the lower index.
    assert largest_remainder([1, 1, 1], 7) == [3, 2, 2]
    assert largest_remainder([0.5, 0.25, 0.25], 0) == [0, 0, 0]


def test_sizes_follow_ratios_equal_and_random_within_spread() -> None:
    rng = np.random.default_rng(0)
    assert hospital_sizes(24, SplitConfig(clients=3, sizes="3,2,1"), rng)[0] == [12, 8, 4]
    assert hospital_sizes(11, SplitConfig(clients=3, sizes="equal"), rng)[0] == [4, 4, 3]
    # An extreme ratio still leaves every client two slides (one per split).
    assert hospital_sizes(12, SplitConfig(clients=3, sizes="100,1,1"), rng)[0] == [8, 2, 2]
    sizes, ratios = hospital_sizes(300, SplitConfig(clients=5, sizes="random"), np.random.default_rng(3))
    assert sum(sizes) == 300
    assert len(ratios) == 5
    assert every(1.0 <= r <= 3.0 for r in ratios)
    assert max(sizes) / min(sizes) <= 3.0 + 1e-9
    assert len(set(sizes)) > 1
    with pytest.raises(PipelineError, match="7 usable slides cannot supply 4 clients"):
        hospital_sizes(7, SplitConfig(clients=4), rng)


def test_iid_gives_every_client_the_overall_mix() -> None:
    labels = _labels(30, 10)
    owners, _ = assign_hospitals(labels, SplitConfig(clients=4, sizes="equal"), np.random.default_rng(1))
    for c in range(4):
        mine = [lab for lab, o in zip(labels, owners, strict=True) if o == c]
        assert len(mine) == 10
        assert mine.count("abnormal") in (2, 3)


def test_dirichlet_keeps_sizes_and_skews_labels_more_than_iid() -> None:
    labels = _labels(60, 60)
    config = SplitConfig(clients=6, sizes="3,3,2,2,1,1", partition=parse_partition("dirichlet:0.1"))
    skewed, _ = assign_hospitals(labels, config, np.random.default_rng(5))
    iid, _ = assign_hospitals(labels, SplitConfig(clients=6, sizes="3,3,2,2,1,1"), np.random.default_rng(5))

    def spread(owners: list[int]) -> float:
        fractions = [
            sum(1 for lab, o in zip(labels, owners, strict=True) if o == c and lab == "abnormal") / owners.count(c)
            for c in range(6)
        ]
        return float(np.mean(np.abs(np.asarray(fractions) - 0.5)))

    assert [skewed.count(c) for c in range(6)] == [iid.count(c) for c in range(6)] == [30, 30, 20, 20, 10, 10]
    assert spread(iid) < 0.05
    assert spread(skewed) > 0.25


def test_classes_one_per_client_alternates_labels() -> None:
    labels = _labels(9, 6)
    config = SplitConfig(clients=4, sizes="2,1,1,2", partition=Partition(kind="classes", classes=1))
    owners, _ = assign_hospitals(labels, config, np.random.default_rng(0))
    held = {c: {lab for lab, o in zip(labels, owners, strict=True) if o == c} for c in range(4)}
    assert held == {0: {"normal"}, 1: {"abnormal"}, 2: {"normal"}, 3: {"abnormal"}}
    # Normal slides shared 2:1 between clients 0 and 2, abnormal 1:2 between 1 and 3.
    assert [owners.count(c) for c in range(4)] == [6, 2, 3, 4]
    with pytest.raises(PipelineError, match="leaves no client holding 'abnormal'"):
        assign_hospitals(
            labels, SplitConfig(clients=1, partition=Partition(kind="classes", classes=1)), np.random.default_rng(0)
        )


def test_test_quota_by_hand() -> None:
    # 2 test slides over (7 normal, 3 abnormal): 1.4 and 0.6 -> floors 1, 0 -> remainder 0.6 wins: (1, 1).
    assert _test_quota([7, 3], 2) == [1, 1]
    # 3 over (9, 1): 2.7, 0.3 -> (3, 0); a single-slide label keeps its slide for training.
    assert _test_quota([9, 1], 3) == [3, 0]
    # 1 over (8, 2): proportional gives (1, 0), but a label with >= 2 slides always gets one test slide.
    assert _test_quota([8, 2], 1) == [1, 1]
    # Never every slide of a label with >= 2 slides in test.
    assert _test_quota([2, 2], 4) == [1, 1]


def test_split_is_per_slide_stratified_and_leaves_both_splits() -> None:
    labels = _labels(7, 3) + _labels(3, 2)
    owners = [0] * 10 + [1] * 5
    split = split_train_test(labels, owners, 2, 0.2, np.random.default_rng(0))
    for c, expect in (
        (0, {("normal", "test"): 1, ("abnormal", "test"): 1}),
        (1, {("normal", "test"): 1, ("abnormal", "test"): 1}),
    ):
        got: dict[tuple[str, str], int] = {}
        for lab, o, s in zip(labels, owners, split, strict=True):
            if o == c and s == "test":
                got[(lab, s)] = got.get((lab, s), 0) + 1
        assert got == expect
    with pytest.raises(PipelineError, match="hospital 1 has 1 slide"):
        split_train_test(["normal"] * 3, [0, 0, 1], 2, 0.2, np.random.default_rng(0))


def test_same_seed_same_assignment_different_seed_different() -> None:
    labels = _labels(20, 20)
    config = SplitConfig(clients=4, sizes="random", partition=parse_partition("dirichlet:1"))
    first = assign_hospitals(labels, config, np.random.default_rng(11))
    assert assign_hospitals(labels, config, np.random.default_rng(11)) == first
    assert assign_hospitals(labels, config, np.random.default_rng(12))[0] != first[0]


def test_validation_split_is_drawn_after_test_stratified_and_slide_disjoint() -> None:
    labels = _labels(7, 3) + _labels(3, 2) + _labels(1, 1)
    owners = [0] * 10 + [1] * 5 + [2] * 2
    without = split_train_test(labels, owners, 3, 0.2, np.random.default_rng(0))
    split = split_train_test(labels, owners, 3, 0.2, np.random.default_rng(0), val_fraction=0.2)
    # The test split is the one a dataset without validation gets: adding validation moves no test slide.
    assert [s == "test" for s in split] == [s == "test" for s in without]
    counts: dict[tuple[int, str, str], int] = {}
    for lab, o, s in zip(labels, owners, split, strict=True):
        counts[(o, lab, s)] = counts.get((o, lab, s), 0) + 1
    # Hospital 0: 10 slides, test 2 (one per label), validation round(0.2 x 10) = 2, one per label (the abnormal
    # label keeps 1 of its 3 slides for training), train 6.
    assert counts[(0, "normal", "val")] == 1
    assert counts[(0, "abnormal", "val")] == 1
    assert counts[(0, "normal", "train")] == 5
    assert counts[(0, "abnormal", "train")] == 1
    # Hospital 1: 5 slides, test 2, validation round(0.2 x 5) = 1 lifted to one per label with >= 2 slides left:
    # 3 left (2 normal, 1 abnormal) -> the normal label gets it, the abnormal one stays in train.
    assert sum(n for (o, _, s), n in counts.items() if o == 1 and s == "val") == 1
    assert sum(n for (o, _, s), n in counts.items() if o == 1 and s == "train") == 2
    # Hospital 2: 2 slides, one test, one train: nothing left for validation.
    assert sorted(s for o, s in zip(owners, split, strict=True) if o == 2) == ["test", "train"]
