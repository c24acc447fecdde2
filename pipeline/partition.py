"""Share slides out over hospitals; split each hospital's slides into train/val/test (FedSAF paper 001, Sec. 4.2).

The paper divides the images "randomly among different clients with varying sizes" and evaluates IID and
non-IID settings, the latter written "(n, S)": n clients holding S classes each. Here:

- **Sizes** (slides per client): ``equal``; a ratio list such as ``3,2,1,1,1``; or ``random``: each client's
  share drawn uniformly from [1, 3] and normalised, so the largest hospital has at most three times the
  slides of the smallest. Counts are rounded by largest remainder and every client gets at least two slides
  (one for each split).
- **Labels** (any number K of classes, in the dataset's class order; K = 2 for SEED and BOT): ``iid`` (every
  client close to the overall class mix), ``dirichlet:ALPHA`` (each client's class mix drawn from
  Dirichlet(ALPHA) over the K classes; small ALPHA = strong skew; client sizes still exact), or ``classes:S``
  (client c holds classes c, c+1, ..., c+S-1 modulo K; each class's slides are shared among its holders in
  proportion to their size ratios, so sizes follow the ratio within each class group), or
  ``abnormal:F0,F1,...`` (a *case mix*, binary datasets only: client c's share of abnormal slides is F_c. The
  abnormal slides are shared over the clients in proportion to ``F_c r_c`` and the normal ones in proportion to
  ``(1 - F_c) r_c``, with r_c the size ratio. Both are exact when the dataset's abnormal share equals the
  size-weighted mean of the F_c; otherwise every client's share moves towards the dataset's, the order of the
  shares is kept (F = 0 still gives no abnormal slide, F = 1 no normal one) and the sizes depart from the ratios.
  This is how hospitals that serve different patients, e.g. a screening clinic and a referral centre, differ).
- **PFLlib's partitions** ``pat:S`` / ``pat-balanced:S`` and ``dir:ALPHA`` (`pipeline.pfl_partition`, for the
  paper's Table 7): hospital and train/validation/test split together, drawn as PFLlib draws them; sizes follow
  from the draws (``--sizes`` does not apply) and the ratios recorded are each hospital's share of the images.
- **Train/validation/test**: per slide, inside each client, stratified by label: ``round(test_fraction * n)``
  slides (at least one, and at least one left for training) go to test, shared over labels in proportion; a
  label with at least two slides in the client always gets one test and one train slide (so small clients still
  have both classes in test, where AUC is defined), which can raise a small client's test share. Then, from
  the slides left, ``round(val_fraction * n)`` go to validation by the same rule (at least one when two or more
  are left, one always staying in train; none when only one is left). The validation split is where thresholds
  and other choices are made; the test split is only judged (docs/pipeline.md). Test is drawn first, so
  adding a validation split leaves every test split as it was. No slide has tiles in two splits.

Everything is drawn from one ``numpy.random.default_rng(seed)`` in a fixed order: same slides + seed,
same assignment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipeline.config import LABELS, SplitConfig, size_ratios
from pipeline.errors import PipelineError
from pipeline.pfl_partition import pfl_assign

# "random" sizes: shares uniform in [1, _RANDOM_SPREAD] before normalising.
_RANDOM_SPREAD = 3.0


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Integers proportional to ``weights`` summing to ``total`` (Hamilton's method; ties to the lower index)."""
    weight_sum = float(sum(weights))
    exact = [total * w / weight_sum for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def hospital_sizes(n_slides: int, config: SplitConfig, rng: np.random.Generator) -> tuple[list[int], list[float]]:
    """Slides per hospital and the ratios they follow; each hospital gets at least 2 (one train, one test)."""
    hospitals = config.clients
    if n_slides < 2 * hospitals:
        raise PipelineError(
            f"{n_slides} usable slides cannot supply {hospitals} clients with at least 2 slides each (one for train, "
            f"one for test); use --clients {max(1, n_slides // 2)} or fewer, or add slides"
        )
    ratios = size_ratios(config.sizes, hospitals)
    if ratios is None:
        ratios = tuple(float(r) for r in rng.uniform(1.0, _RANDOM_SPREAD, size=hospitals))
    counts = largest_remainder(ratios, n_slides)
    # Lift tiny clients to 2 slides, taking from the largest (rare: only with extreme ratios).
    for i in range(hospitals):
        while counts[i] < 2:
            donor = max(range(hospitals), key=lambda j: (counts[j], -j))
            counts[donor] -= 1
            counts[i] += 1
    return counts, list(ratios)


def _by_label(labels: Sequence[str], rng: np.random.Generator, classes: Sequence[str]) -> dict[str, list[int]]:
    """Slide indices per label, in class order, each list shuffled."""
    groups: dict[str, list[int]] = {}
    for label in classes:
        members = [i for i, lab in enumerate(labels) if lab == label]
        groups[label] = [members[k] for k in rng.permutation(len(members))]
    return groups


def _iid(labels: Sequence[str], sizes: Sequence[int], rng: np.random.Generator, classes: Sequence[str]) -> list[int]:
    groups = _by_label(labels, rng, classes)
    # Spread each label evenly along one sequence, then cut it into consecutive chunks of the client sizes:
    # every chunk then holds (within one slide) the overall label mix.
    keyed: list[tuple[float, int]] = []
    for members in groups.values():
        offset = float(rng.uniform(0.0, 1.0))
        keyed.extend(((k + offset) / len(members), slide) for k, slide in enumerate(members))
    keyed.sort()
    owner = [0] * len(labels)
    position = 0
    for hospital, size in enumerate(sizes):
        for _, slide in keyed[position : position + size]:
            owner[slide] = hospital
        position += size
    return owner


def _dirichlet(
    labels: Sequence[str], sizes: Sequence[int], alpha: float, rng: np.random.Generator, classes: Sequence[str]
) -> list[int]:
    groups = _by_label(labels, rng, classes)
    remaining = {label: list(members) for label, members in groups.items()}
    owner = [0] * len(labels)
    for hospital in rng.permutation(len(sizes)):
        size = sizes[int(hospital)]
        mix = rng.dirichlet([alpha] * len(classes))
        want = largest_remainder([float(m) + 1e-12 for m in mix], size)
        take = {label: min(w, len(remaining[label])) for label, w in zip(classes, want, strict=True)}
        # Labels that ran out are made up from those with slides left; the total always suffices because
        # the slides left equal the sizes of the clients left.
        while sum(take.values()) < size:
            spare = max(classes, key=lambda lab: (len(remaining[lab]) - take[lab], lab == classes[0]))
            take[spare] += 1
        for label, count in take.items():
            for slide in remaining[label][:count]:
                owner[slide] = int(hospital)
            remaining[label] = remaining[label][count:]
    return owner


def _classes(
    labels: Sequence[str],
    ratios: Sequence[float],
    per_hospital: int,
    rng: np.random.Generator,
    classes: Sequence[str],
) -> tuple[list[int], list[int]]:
    hospitals = len(ratios)
    holders = {
        label: [c for c in range(hospitals) if (k - c) % len(classes) < per_hospital] for k, label in enumerate(classes)
    }
    groups = _by_label(labels, rng, classes)
    owner = [0] * len(labels)
    for label, members in groups.items():
        if not members:
            continue
        if not holders[label]:
            raise PipelineError(
                f"partition classes:{per_hospital} with {hospitals} client(s) leaves no client holding '{label}' "
                "slides; use more clients or a larger S"
            )
        counts = largest_remainder([ratios[c] for c in holders[label]], len(members))
        position = 0
        for hospital, count in zip(holders[label], counts, strict=True):
            for slide in members[position : position + count]:
                owner[slide] = hospital
            position += count
    sizes = [owner.count(c) for c in range(hospitals)]
    return owner, sizes


def _case_mix(
    labels: Sequence[str],
    ratios: Sequence[float],
    shares: Sequence[float],
    rng: np.random.Generator,
    classes: Sequence[str],
) -> list[int]:
    """``abnormal:F0,F1,...``: each label's slides shared in proportion to ``F_c r_c`` (abnormal) and ``(1 - F_c) r_c``
    (normal) by largest remainder, each label's slides shuffled first (module docstring)."""
    if tuple(classes) != LABELS:
        raise PipelineError(
            f"partition abnormal:... needs the binary task's classes {', '.join(LABELS)}, but this dataset's are "
            f"{', '.join(classes)}; use dirichlet:ALPHA or classes:S"
        )
    weights = {
        "abnormal": [f * r for f, r in zip(shares, ratios, strict=True)],
        "normal": [(1.0 - f) * r for f, r in zip(shares, ratios, strict=True)],
    }
    owner = [0] * len(labels)
    for label, members in _by_label(labels, rng, classes).items():
        if not members:
            continue
        if sum(weights[label]) <= 0.0:
            raise PipelineError(
                f"partition abnormal:{','.join(f'{f:g}' for f in shares)} leaves no client to hold the "
                f"{len(members)} {label} slide(s): give at least one client a share "
                + ("above 0" if label == "abnormal" else "below 1")
            )
        position = 0
        for hospital, count in enumerate(largest_remainder(weights[label], len(members))):
            for slide in members[position : position + count]:
                owner[slide] = hospital
            position += count
    return owner


def assign_hospitals(
    labels: Sequence[str], config: SplitConfig, seed_rng: np.random.Generator, classes: Sequence[str] = LABELS
) -> tuple[list[int], list[float]]:
    """The hospital of each slide (by position in ``labels``) and the size ratios used; ``classes`` in class order."""
    part = config.partition
    if part.kind == "classes" and part.classes > len(classes):
        raise PipelineError(
            f"partition classes:{part.classes} asks for more classes per client than the {len(classes)} the dataset "
            f"has; use classes:S with S in 1..{len(classes)}"
        )
    sizes, ratios = hospital_sizes(len(labels), config, seed_rng)
    if part.kind == "classes" and part.classes < len(classes):
        owner, actual = _classes(labels, ratios, part.classes, seed_rng, classes)
        short = [c for c, n in enumerate(actual) if n < 2]
        if short:
            raise PipelineError(
                f"partition classes:{part.classes} leaves client(s) {', '.join(map(str, short))} with fewer than 2 "
                "slides; use fewer clients or more slides of each label"
            )
        return owner, ratios
    if part.kind == "abnormal":
        owner = _case_mix(labels, ratios, part.shares, seed_rng, classes)
        short = [c for c in range(config.clients) if owner.count(c) < 2]
        if short:
            raise PipelineError(
                f"partition {part.spec()} leaves client(s) {', '.join(map(str, short))} with fewer than 2 slides; "
                "use fewer clients, shares nearer the dataset's abnormal share, or more slides"
            )
        return owner, ratios
    if part.kind == "dirichlet":
        return _dirichlet(labels, sizes, part.alpha, seed_rng, classes), ratios
    return _iid(labels, sizes, seed_rng, classes), ratios


PFL_KINDS: tuple[str, ...] = ("pat", "dir")


def pfl_split(
    labels: Sequence[str], config: SplitConfig, classes: Sequence[str]
) -> tuple[list[int], list[str], list[float]]:
    """PFLlib's ``pat``/``dir`` partition (`pipeline.pfl_partition.pfl_assign`): each slide's hospital and split,
    and each hospital's share of the slides as its size ratio."""
    part = config.partition
    if part.kind == "pat" and part.classes > len(classes):
        raise PipelineError(
            f"partition {part.spec()} asks for more classes per client than the {len(classes)} the dataset has; "
            f"use S in 1..{len(classes)}"
        )
    owners, splits = pfl_assign(
        labels,
        classes,
        config.clients,
        part.kind,
        config.seed,
        config.test_fraction,
        config.val_fraction,
        class_per_client=part.classes,
        balance=part.balanced,
        alpha=part.alpha,
    )
    total = max(1, len(labels))
    return owners, splits, [owners.count(c) / total for c in range(config.clients)]


def _test_quota(group_sizes: Sequence[int], n_test: int) -> list[int]:
    """Test slides per label group: proportional, but every label with >= 2 slides gets one test and one train slide.

    Without this, a client with few slides often gets a one-class test split, where AUC is undefined.
    """
    quota = largest_remainder([float(n) for n in group_sizes], n_test)
    for g, size in enumerate(group_sizes):
        if size >= 2 and quota[g] == 0:
            donors = [d for d in range(len(quota)) if quota[d] > 1]
            if donors:
                quota[max(donors, key=lambda d: (quota[d], -d))] -= 1
            quota[g] = 1
        if size >= 2 and quota[g] == size:
            quota[g] -= 1
    if sum(quota) == 0:
        quota[max(range(len(quota)), key=lambda d: (group_sizes[d], -d))] += 1
    if sum(quota) == sum(group_sizes):
        quota[max(range(len(quota)), key=lambda d: (quota[d], -d))] -= 1
    return quota


def split_train_test(
    labels: Sequence[str],
    owners: Sequence[int],
    hospitals: int,
    test_fraction: float,
    rng: np.random.Generator,
    classes: Sequence[str] = LABELS,
    val_fraction: float = 0.0,
) -> list[str]:
    """``train``/``val``/``test`` for each slide: per client, stratified by label, at least one slide in train and
    test; with ``val_fraction`` > 0 a validation split drawn from the slides left after the test split (so the test
    split is the one ``val_fraction = 0`` gives), whenever at least two slides are left (one stays in train)."""
    split = _split_test(labels, owners, hospitals, test_fraction, rng, classes)
    if val_fraction <= 0.0:
        return split
    for hospital in range(hospitals):
        members = [i for i, c in enumerate(owners) if c == hospital]
        rest = [i for i in members if split[i] == "train"]
        if len(rest) < 2:
            continue
        n_val = min(len(rest) - 1, max(1, math.floor(val_fraction * len(members) + 0.5)))
        _draw(split, rest, n_val, "val", labels, classes, rng)
    return split


def no_validation(owners: Sequence[int], splits: Sequence[str], hospitals: int, val_fraction: float) -> str | None:
    """The warning that names the hospitals a ``val_fraction > 0`` left without a validation split, or ``None``.

    A validation split needs a slide of its own beside one for test and one for training (`split_train_test`), so a
    hospital of 2 slides gets none whatever the fraction; a threshold chosen from a sensitivity floor is then chosen
    on its test split, which is optimistic (docs/pipeline.md, "Splits")."""
    if val_fraction <= 0.0:
        return None
    slides = [sum(1 for o in owners if o == c) for c in range(hospitals)]
    without = [
        c for c in range(hospitals) if not any(o == c and s == "val" for o, s in zip(owners, splits, strict=True))
    ]
    if not without:
        return None
    sizes = sorted({slides[c] for c in without})
    return (
        f"--val-fraction {val_fraction:g}: {len(without)} of {hospitals} hospitals got no validation split "
        f"(hospital {', '.join(str(c) for c in without)}; {' or '.join(str(n) for n in sizes)} slides each, and a "
        "validation split needs a third slide beside one for test and one for training): their thresholds from a "
        "sensitivity floor will be chosen on test, which is optimistic"
    )


def _draw(
    split: list[str],
    pool: Sequence[int],
    count: int,
    name: str,
    labels: Sequence[str],
    classes: Sequence[str],
    rng: np.random.Generator,
) -> None:
    """Mark ``count`` slides of ``pool`` as split ``name``, stratified by label (`_test_quota`), drawn by ``rng``."""
    groups = [[i for i in pool if labels[i] == label] for label in classes]
    groups = [g for g in groups if g]
    quota = _test_quota([len(g) for g in groups], count)
    for group, n in zip(groups, quota, strict=True):
        for k in rng.permutation(len(group))[:n]:
            split[group[int(k)]] = name


def _split_test(
    labels: Sequence[str],
    owners: Sequence[int],
    hospitals: int,
    test_fraction: float,
    rng: np.random.Generator,
    classes: Sequence[str],
) -> list[str]:
    """``train``/``test`` for each slide: per client, stratified by label, at least one slide in each split."""
    split = ["train"] * len(labels)
    for hospital in range(hospitals):
        members = [i for i, c in enumerate(owners) if c == hospital]
        if len(members) < 2:
            raise PipelineError(
                f"hospital {hospital} has {len(members)} slide(s); each hospital needs at least 2 (one train, one test)"
            )
        n_test = min(len(members) - 1, max(1, math.floor(test_fraction * len(members) + 0.5)))
        _draw(split, members, n_test, "test", labels, classes, rng)
    return split
