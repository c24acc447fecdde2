"""PFLlib's partition (`pipeline.pfl_partition`): exact counts and indices on small label arrays, worked by hand
from the rules of PFLlib's ``separate_data`` / ``split_data`` and the raw draws of ``RandomState(seed)``."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import parse_partition
from pipeline.errors import PipelineError
from pipeline.pfl_partition import MAX_TRIES, pfl_assign, separate, split


def test_pat_balanced_gives_slices_in_dataset_order_to_the_first_clients_with_slots() -> None:
    # 3 classes x 8 items, 6 clients, 2 classes per client, balanced: no random draw in the separation.
    labels = np.repeat([0, 1, 2], 8)
    parts = separate(labels, 6, 3, "pat", np.random.RandomState(0), class_per_client=2, balance=True)
    # class 0: the first ceil(6/3*2) = 4 clients with slots (0-3), int(8/4) = 2 each, the last what is left (2)
    # class 1: clients 0-3 again (one slot left each), 2 each; class 2: only 4 and 5 have slots, 4 each
    assert [p.tolist() for p in parts] == [
        [0, 1, 8, 9],
        [2, 3, 10, 11],
        [4, 5, 12, 13],
        [6, 7, 14, 15],
        [16, 17, 18, 19],
        [20, 21, 22, 23],
    ]


def test_pat_unbalanced_counts_from_the_seeded_draws_then_the_75_25_split() -> None:
    labels = np.array([0, 1] * 20)  # class 0 at the even indices, class 1 at the odd ones
    rs = np.random.RandomState(1)
    # RandomState(1).randint(1, 10, 1) twice gives 6 then 9 (the raw generator), and PFLlib's float bounds
    # max(10/10, 1/2) = 1.0 and 10.0 draw the same numbers as the integers
    assert np.random.RandomState(1).randint(1.0, 10.0, 1).tolist() == [6]  # type: ignore[call-overload]
    parts = separate(labels, 4, 2, "pat", rs, class_per_client=1, balance=False)
    # class 0 -> clients 0, 1: 6 and 20 - 6 = 14; class 1 -> clients 2, 3: 9 and 11
    assert [len(p) for p in parts] == [6, 14, 9, 11]
    assert parts[0].tolist() == [0, 2, 4, 6, 8, 10]
    assert parts[2].tolist() == [1, 3, 5, 7, 9, 11, 13, 15, 17]
    pairs = split(parts, rs, 0.75)
    # train floor(0.75 n), test the rest: 4/2, 10/4, 6/3, 8/3
    assert [(len(a), len(b)) for a, b in pairs] == [(4, 2), (10, 4), (6, 3), (8, 3)]
    # client 0: the next draw is permutation(6) = [4 2 0 5 3 1]; test = its first 2 positions, train the rest
    assert pairs[0][1].tolist() == [8, 4]
    assert pairs[0][0].tolist() == [0, 10, 6, 2]


def test_dir_zeroes_a_full_client_and_gives_it_none_of_the_next_class() -> None:
    labels = np.repeat([0, 1], 10)
    # RandomState(1): shuffle of class 0 -> [2 9 6 4 0 3 1 7 8 5]; Dirichlet(0.1, 0.1) -> (0.000137, 0.999863),
    # cut int(0.000137 * 10) = 0: client 0 gets none of class 0, client 1 all ten. Class 1: client 1 holds
    # 10 >= N / clients = 10, so its proportion is zeroed and client 0 gets all of class 1 (in shuffled order).
    parts = separate(labels, 2, 2, "dir", np.random.RandomState(1), alpha=0.1)
    assert parts[1].tolist() == [2, 9, 6, 4, 0, 3, 1, 7, 8, 5]
    assert sorted(parts[0].tolist()) == list(range(10, 20))


def test_dir_retries_and_stops_with_one_line_when_a_client_stays_too_small() -> None:
    # Two items cannot give three clients one each: PFLlib would loop forever.
    with pytest.raises(PipelineError, match=rf"dir:0.1 left a client with fewer than 1 image\(s\) in {MAX_TRIES}"):
        separate(np.array([0, 1]), 3, 2, "dir", np.random.RandomState(0), alpha=0.1)


def test_assign_carves_validation_from_train_and_keeps_pfllib_test() -> None:
    labels = [str(v) for v in [0, 1] * 20]
    owners, splits = pfl_assign(labels, ("0", "1"), 4, "pat", 1, 0.25, 0.0, class_per_client=1)
    owners_v, splits_v = pfl_assign(labels, ("0", "1"), 4, "pat", 1, 0.25, 0.2, class_per_client=1)
    assert owners == owners_v
    assert [i for i, s in enumerate(splits) if s == "test"] == [i for i, s in enumerate(splits_v) if s == "test"]
    # client 0 holds 6 images (4 train, 2 test): round(0.2 * 6) = 1 of its train images goes to validation
    per_client = [
        sorted(s for o, s in zip(owners_v, splits_v, strict=True) if o == c and s != "test") for c in range(4)
    ]
    assert [row.count("val") for row in per_client] == [1, 3, 2, 2]  # round(0.2 n) for n = 6, 14, 9, 11
    assert splits.count("val") == 0


def test_pat_refuses_more_classes_per_client_than_the_dataset_has_and_too_few_images() -> None:
    assert parse_partition("pat:2").spec() == "pat:2"
    assert parse_partition("pat-balanced:3").balanced
    assert parse_partition("dir:0.1").spec() == "dir:0.1"
    with pytest.raises(PipelineError, match="pat:0"):
        parse_partition("pat:0")
    # one image of class 0 over 2 clients: equal share 0.5, bounds int(max(0.05, 1/2)) = 0 and int(0.5) = 0,
    # an empty range (numpy would raise "low >= high"): refused with one line naming the class
    with pytest.raises(PipelineError, match="class 0 has 1 image\\(s\\) for 2 clients"):
        separate(np.array([0, 1, 1, 1]), 2, 2, "pat", np.random.RandomState(0), class_per_client=2)


# Counts and first test indices that PFLlib's own separate_data + split_data (dataset/utils/dataset_utils.py, run
# as generate_FashionMNIST.py runs it: np.random.seed(1), 20 clients, train_size 0.75) give on Fashion-MNIST's
# 70,000 merged labels with numpy 2.4; our functions must reproduce them draw for draw.
PFLLIB_FASHION_MNIST: dict[tuple[str, int], tuple[str, str, str]] = {
    ("pat", 10): (
        "1361 1603 1320 1290 1110 1583 1065 1365 1459 1340 1447 1789 1362 1100 1467 1207 1805 1588 1686 25545",
        "454 535 441 431 370 528 356 456 487 447 483 597 454 367 489 403 602 530 562 8516",
        "1027 5174 4975 5514 10113",
    ),
    ("pat", 2): (
        "1737 975 1719 6068 1544 751 1419 6784 2199 1431 1923 4945 1749 1443 750 6557 1434 1262 2337 5466",
        "579 325 574 2023 515 251 474 2262 734 478 641 1649 583 482 250 2186 479 421 779 1822",
        "6810 14186 21844 34527 9013",
    ),
    ("dir", 0): (
        "61 240 656 1952 1091 4104 3288 3345 4170 2667 4627 5102 6413 469 996 146 2202 3624 3817 3523",
        "21 80 219 651 364 1369 1097 1116 1390 889 1543 1701 2138 157 332 49 735 1208 1273 1175",
        "43941 40330 48555 59034 2927",
    ),
}


@pytest.mark.parametrize(("kind", "per_client"), sorted(PFLLIB_FASHION_MNIST))
def test_fashion_mnist_counts_equal_pfllibs_own_code(kind: str, per_client: int) -> None:
    from pipeline.idx import FASHION_MNIST_DIR, image_sets, load_set

    if not FASHION_MNIST_DIR.is_dir():
        pytest.fail(f"{FASHION_MNIST_DIR} is missing: install Debian's package dataset-fashion-mnist (scripts/test.sh)")
    labels = np.concatenate([load_set(s)[1] for s in image_sets(FASHION_MNIST_DIR)]).astype(np.int64)
    rs = np.random.RandomState(1)
    parts = separate(labels, 20, 10, kind, rs, class_per_client=per_client, alpha=0.1)
    pairs = split(parts, rs, 0.75)
    train, test, first_test = ([int(n) for n in text.split()] for text in PFLLIB_FASHION_MNIST[(kind, per_client)])
    assert [len(a) for a, _ in pairs] == train
    assert [len(b) for _, b in pairs] == test
    assert [int(b[0]) for _, b in pairs[:5]] == first_test
