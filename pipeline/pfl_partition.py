"""PFLlib's partition of a labelled dataset over clients, reproduced draw for draw (`prepare --partition pat:S|dir:A`).

The FedSAF paper's Table 7 (001, "Noniid-Unbalanced Dataset Generalization") comes from code in the style of
PFLlib (Zhang et al., "PFLlib: A Beginner-Friendly and Comprehensive Personalized Federated Learning Library",
JMLR 2025; github.com/TsingZ0/PFLlib). Its generator (``dataset/generate_FashionMNIST.py``) merges the training
and test images (60,000 + 10,000, in that order), seeds numpy's legacy global generator (``np.random.seed(1)``)
and calls ``separate_data`` then ``split_data`` (``dataset/utils/dataset_utils.py``). This module is those two
functions over image indices, with the same calls on one ``numpy.random.RandomState(seed)`` (the legacy global
generator is such an object, so the draws, and the counts, are the same for the same seed and numpy version):

- ``pat`` (``separate_data``, ``partition='pat'``): the images of class i, in dataset order, go to the first
  ``ceil(num_clients / num_classes * class_per_client)`` clients that still have class slots left (each client
  has ``class_per_client`` slots). With ``balance`` each of them but the last gets ``int(n_i / m)`` images
  (n_i images of the class, m clients selected); without it ("unbalanced", PFLlib's and the paper's non-IID
  setting) each but the last gets ``randint(max(n_i/m / 10, least_samples / num_classes), n_i/m)`` images:
  numpy's legacy ``randint`` truncates both float bounds, so a count in ``[int(share / 10), int(share) - 1]``,
  between a tenth of and just under the equal share, and the last client what is left (at least the equal
  share); consecutive slices of the class's images in dataset order, no shuffle.
- ``dir`` (``partition='dir'``, after Yurochkin et al.'s PFNM experiment code): per class k, its images
  shuffled, proportions drawn from Dirichlet(alpha) over the clients, zeroed for clients already holding at
  least N / num_clients images and renormalised, cut points ``int(cumsum * n_k)``; repeated from scratch while
  some client holds fewer than ``least_samples`` images (PFLlib: alpha 0.1, least_samples 1).
- ``split_data``: each client's images, in the order above, split by scikit-learn's ``train_test_split``
  (``train_size`` 0.75, ``shuffle=True``), which draws one permutation from the same generator.

Departures, all outside PFLlib's draws: (1) a validation split is carved out of each client's training part
(``round(val_fraction * n)`` images, at least one image left in train), drawn from a separate
``numpy.random.default_rng([seed, client])``, so that the test split and every PFLlib draw stay as they were;
``val_fraction = 0`` gives PFLlib's split exactly. (2) ``train_size`` is ``1 - test_fraction``
(``--test-fraction 0.25`` is PFLlib's 0.75). (3) PFLlib's ``dir`` loop has no bound; here it stops after
`MAX_TRIES` attempts with an error. (4) A client left with too few images for train and test is refused with one
line instead of scikit-learn's exception.

Names: ``class_per_client`` and ``class_num_per_client`` are PFLlib's, kept so that this code reads beside
``separate_data``; its ``num_clients`` is ``num_hospitals`` here (docs/design.md, "Public formats that say client").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pipeline.errors import PipelineError

LEAST_SAMPLES = 1  # PFLlib's least_samples (dataset_utils.py)
MAX_TRIES = 1000

IndexArray = npt.NDArray[np.int64]


def separate(
    labels: npt.NDArray[np.integer],
    num_hospitals: int,
    num_classes: int,
    kind: str,
    rs: np.random.RandomState,
    class_per_client: int = 0,
    balance: bool = False,
    alpha: float = 0.1,
    least_samples: int = LEAST_SAMPLES,
) -> list[IndexArray]:
    """PFLlib's ``separate_data`` on indices: each client's dataset indices, in PFLlib's order (module docstring).

    ``labels`` are class indices 0..num_classes-1 in dataset order; ``kind`` is ``pat`` or ``dir``; ``rs`` is
    the generator PFLlib's global one would be (``RandomState(seed)``), advanced exactly as PFLlib advances it.
    """
    labels = np.asarray(labels)
    if kind == "pat":
        return _pat(labels, num_hospitals, num_classes, rs, class_per_client, balance, least_samples)
    if kind == "dir":
        return _dir(labels, num_hospitals, num_classes, rs, alpha, least_samples)
    raise PipelineError(f"PFLlib partition {kind!r} is unknown; use pat or dir")


def _pat(
    labels: npt.NDArray[np.integer],
    num_hospitals: int,
    num_classes: int,
    rs: np.random.RandomState,
    class_per_client: int,
    balance: bool,
    least_samples: int,
) -> list[IndexArray]:
    idxs = np.array(range(len(labels)))
    idx_for_each_class = [idxs[labels == i] for i in range(num_classes)]
    class_num_per_client = [class_per_client for _ in range(num_hospitals)]
    owned: dict[int, IndexArray] = {}
    for i in range(num_classes):
        selected = [c for c in range(num_hospitals) if class_num_per_client[c] > 0]
        selected = selected[: int(np.ceil((num_hospitals / num_classes) * class_per_client))]
        num_all = len(idx_for_each_class[i])
        if not selected:
            raise PipelineError(
                f"partition pat:{class_per_client} with {num_hospitals} client(s) and {num_classes} classes leaves no "
                f"client with a free class slot for class {i}; use more clients or a larger class count per client"
            )
        num_per = num_all / len(selected)
        if balance:
            num_samples = [int(num_per) for _ in range(len(selected) - 1)]
        else:
            low = max(num_per / 10, least_samples / num_classes)
            if len(selected) > 1 and not int(low) < int(num_per):
                raise PipelineError(
                    f"partition pat:{class_per_client}: class {i} has {num_all} image(s) for {len(selected)} clients "
                    f"(equal share {num_per:g}), too few to draw unbalanced counts; use fewer clients or more images"
                )
            # PFLlib passes the floats; numpy's legacy randint truncates both bounds to integers, so the ints
            # draw the same numbers (checked against the float call in tests/pipeline/test_pfl_partition.py).
            num_samples = rs.randint(int(low), int(num_per), len(selected) - 1).tolist()
        num_samples.append(num_all - sum(num_samples))
        start = 0
        for hospital, count in zip(selected, num_samples, strict=True):
            part = idx_for_each_class[i][start : start + count]
            owned[hospital] = part if hospital not in owned else np.append(owned[hospital], part, axis=0)
            start += count
            class_num_per_client[hospital] -= 1
    missing = [c for c in range(num_hospitals) if c not in owned]
    if missing:
        raise PipelineError(
            f"partition pat:{class_per_client} gives client(s) {', '.join(map(str, missing))} no image "
            f"({num_hospitals} clients x {class_per_client} classes cannot cover {num_classes} classes in PFLlib's "
            "order); use fewer clients or more classes per client"
        )
    return [np.asarray(owned[c], dtype=np.int64) for c in range(num_hospitals)]


def _dir(
    labels: npt.NDArray[np.integer],
    num_hospitals: int,
    num_classes: int,
    rs: np.random.RandomState,
    alpha: float,
    least_samples: int,
) -> list[IndexArray]:
    n = len(labels)
    min_size = 0
    tries = 0
    idx_batch: list[list[int]] = [[] for _ in range(num_hospitals)]
    while min_size < least_samples:
        tries += 1
        if tries > MAX_TRIES:
            raise PipelineError(
                f"partition dir:{alpha:g} left a client with fewer than {least_samples} image(s) in {MAX_TRIES} "
                "draws; use fewer clients or a larger alpha"
            )
        idx_batch = [[] for _ in range(num_hospitals)]
        for k in range(num_classes):
            idx_k = np.where(labels == k)[0]
            rs.shuffle(idx_k)
            proportions = rs.dirichlet(np.repeat(alpha, num_hospitals))
            proportions = np.array(
                [p * (len(idx_j) < n / num_hospitals) for p, idx_j in zip(proportions, idx_batch, strict=True)]
            )
            proportions = proportions / proportions.sum()
            cuts = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, cuts), strict=True)]
            min_size = min(len(idx_j) for idx_j in idx_batch)
    return [np.asarray(batch, dtype=np.int64) for batch in idx_batch]


def split(
    hospitals: Sequence[IndexArray], rs: np.random.RandomState, train_size: float
) -> list[tuple[IndexArray, IndexArray]]:
    """PFLlib's ``split_data`` on indices: (train, test) per client, by scikit-learn's ``train_test_split``
    (``shuffle=True``, ``random_state=rs``: one ``rs.permutation`` per client; test the first
    ``n - floor(train_size n)`` of it, train the rest, in permutation order)."""
    from sklearn.model_selection import train_test_split

    out: list[tuple[IndexArray, IndexArray]] = []
    for hospital, members in enumerate(hospitals):
        if math.floor(train_size * len(members)) < 1 or len(members) - math.floor(train_size * len(members)) < 1:
            raise PipelineError(
                f"client {hospital} holds {len(members)} image(s), too few for a train and a test part at train size "
                f"{train_size:g}; use fewer clients or a larger alpha"
            )
        train, test = train_test_split(members, train_size=train_size, shuffle=True, random_state=rs)
        out.append((np.asarray(train, dtype=np.int64), np.asarray(test, dtype=np.int64)))
    return out


def pfl_assign(
    labels: Sequence[str],
    classes: Sequence[str],
    hospitals: int,
    kind: str,
    seed: int,
    test_fraction: float,
    val_fraction: float,
    class_per_client: int = 0,
    balance: bool = False,
    alpha: float = 0.1,
) -> tuple[list[int], list[str]]:
    """The client and split (``train``/``val``/``test``) of each item of ``labels`` (class names, dataset order):
    PFLlib's ``separate_data`` + ``split_data`` from ``RandomState(seed)``, then the validation carve-out
    (module docstring, departure 1)."""
    index = {name: k for k, name in enumerate(classes)}
    values = np.array([index[label] for label in labels], dtype=np.int64)
    rs = np.random.RandomState(seed)
    parts = separate(values, hospitals, len(classes), kind, rs, class_per_client, balance, alpha)
    owners = [-1] * len(labels)
    splits = [""] * len(labels)
    for hospital, (train, test) in enumerate(split(parts, rs, 1.0 - test_fraction)):
        n = len(train) + len(test)
        n_val = min(len(train) - 1, math.floor(val_fraction * n + 0.5)) if val_fraction > 0 else 0
        chosen = set(np.random.default_rng([seed, hospital]).permutation(len(train))[:n_val].tolist())
        for k, item in enumerate(train.tolist()):
            owners[item], splits[item] = hospital, "val" if k in chosen else "train"
        for item in test.tolist():
            owners[item], splits[item] = hospital, "test"
    return owners, splits
