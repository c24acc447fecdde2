"""Shortcut probe: how well label-free pixel statistics alone separate a prepared dataset's classes.

A model can learn from anything that differs between the classes, not only from the disease. The paper's Step a.1
(FedSAF paper 001, Sec. 4.2) whitens everything outside the cancer mask of abnormal slides, which writes the label
into the pixels: painted pure white occurs in almost every abnormal tile and in almost no normal one, and one pixel
count then separates the classes with no learning at all. Every prepared dataset therefore carries this probe
(docs/pipeline.md, "Shortcut probe"): for each statistic below, on each split, the AUC of the statistic taken as a
score, oriented so that 0.5 means "tells nothing" and 1.0 "separates perfectly" (``max(AUC, 1 - AUC)``: a model
can use a statistic in either direction). Above `WARN_AUC` prepare warns in one line.

Statistics of a tile's stored pixels (what the model sees): the share of pure-white pixels (every channel 255),
the share of near-white pixels (every channel >= ``white_level``, prepare's definition), the mean intensity, the
mean of each RGB channel (a gray tile's three means are its intensity), the standard deviation of the per-pixel
gray value (the mean over the channels; population, ``ddof=0``), the mean HSV-style saturation
(``(max - min) / max`` over a pixel's channels, 0 where ``max`` is 0; 0 for a gray tile) and the share of dark,
nuclear-like pixels (gray value below `DARK_LEVEL`). The last three follow the team's stand-alone check
(``../shared/tools/label_free_probe.py``, ``stats``) exactly, so the two agree. AUC by scikit-learn's
``roc_auc_score``; with more than two classes the mean of the one-vs-rest AUCs.

Chance on few slides (``record["chance"]``, `chance_within`): the tiles of one slide share its stain, density and
label, so a split's tile-level AUC rests on its slides, not its tiles, and a validation or test split of a dozen
slides can reach 0.7-0.8 with no shortcut at all. Per split, the probe shuffles the slides' labels within each
hospital (each hospital keeps how many slides of each label it holds) and recomputes the highest within-hospital
AUC over the statistics: a permutation test of the max statistic (Westfall and Young, *Resampling-Based Multiple
Testing*, 1993), which already accounts for looking at every statistic. ``chance_95`` is the 95th percentile of
that maximum over the shuffles, ``p_value`` the share of shuffles (the observed labelling counted) at or above
the observed worst: a worst statistic above `WARN_AUC` but below ``chance_95`` is what a split of this many slides
gives by chance.

A record written before a statistic was added lacks its key: readers take the statistics a record names
(``record["statistics"]``), not `STATISTICS`; one written before the chance test has no ``chance``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infra.formats import MANIFEST_FILE

STATISTICS: tuple[str, ...] = (
    "pure_white",
    "near_white",
    "mean_intensity",
    "mean_red",
    "mean_green",
    "mean_blue",
    "std_intensity",
    "mean_saturation",
    "dark_fraction",
)
DESCRIPTIONS: dict[str, str] = {
    "pure_white": "share of pixels with every channel at 255 (painted white)",
    "near_white": "share of near-white pixels (every channel >= white_level)",
    "mean_intensity": "mean pixel value over all channels",
    "mean_red": "mean of the red channel",
    "mean_green": "mean of the green channel",
    "mean_blue": "mean of the blue channel",
    "std_intensity": "standard deviation of the pixels' gray value (contrast)",
    "mean_saturation": "mean colour saturation, (max - min) / max of a pixel's channels",
    "dark_fraction": "share of dark pixels (gray value < 100, nuclear-like)",
}
# A pixel whose gray value (mean over its channels) is below this counts as dark: nuclei, not stroma or background.
DARK_LEVEL = 100
# Above this AUC one statistic alone separates the classes well enough that a model need not look at tissue.
WARN_AUC = 0.70
# Label shuffles of the chance test (`chance_within`), drawn from a fixed seed so that a record is reproducible.
CHANCE_SHUFFLES = 999
CHANCE_SEED = 0


def tile_statistics(pixels: npt.NDArray[np.uint8], white_level: int) -> tuple[float, ...]:
    """The `STATISTICS` of one stored tile (``H x W`` gray or ``H x W x 3`` RGB), in that order.

    Prepare calls this on every kept tile, so it works plane by plane on the uint8 pixels (element-wise minimum,
    maximum and sum of the channel planes are several times faster than reductions over the channel axis). The
    gray value is kept as the integer channel sum: "dark" is the exact integer test ``sum < DARK_LEVEL * channels``,
    and every mean is an exact integer sum divided once.
    """
    planes = [pixels] if pixels.ndim == 2 else [pixels[:, :, k] for k in range(pixels.shape[2])]
    colour = planes[:3]  # the colour channels, as the stand-alone check reads them
    channels = len(colour)
    lowest = functools.reduce(np.minimum, planes)
    count = lowest.size
    total = functools.reduce(np.add, colour[1:], colour[0].astype(np.uint16))
    sums = [int(plane.sum(dtype=np.int64)) for plane in planes]
    red, green, blue = (sums[0] / count,) * 3 if channels == 1 else (value / count for value in sums[:3])
    if channels == 1:
        saturation = 0.0  # one channel: max == min everywhere
    else:
        highest = functools.reduce(np.maximum, colour)
        spread = (highest - functools.reduce(np.minimum, colour)).astype(np.float64)
        # (max - min) / max, 0 where max is 0 (a black pixel has no hue)
        ratio = np.divide(spread, highest, out=np.zeros_like(spread), where=highest > 0)
        saturation = float(ratio.mean())
    return (
        int(np.count_nonzero(lowest == 255)) / count,
        int(np.count_nonzero(lowest >= white_level)) / count,
        sum(sums) / (count * len(planes)),
        red,
        green,
        blue,
        float(total.std(dtype=np.float64)) / channels,
        saturation,
        int(np.count_nonzero(total < DARK_LEVEL * channels)) / count,
    )


def separation_auc(
    values: Sequence[float] | npt.NDArray[np.float64], labels: Sequence[int] | npt.NDArray[np.int_]
) -> float | None:
    """``max(AUC, 1 - AUC)`` of ``values`` as a score for the labels (mean one-vs-rest over >2 classes); ``None``
    when fewer than two classes are present."""
    # imported here: pipeline.prepare (and with it this module) is imported by the dashboard, which keeps scikit-learn
    # out of its pages' start-up
    from sklearn.metrics import roc_auc_score

    y = np.asarray(labels)
    present = np.unique(y)
    if len(present) < 2:
        return None
    x = np.asarray(values, dtype=np.float64)
    targets = present[1:] if len(present) == 2 else present
    aucs = [float(roc_auc_score(y == k, x)) for k in targets]
    return float(np.mean([max(a, 1.0 - a) for a in aucs]))


def within_auc(
    values: Sequence[float] | npt.NDArray[np.float64],
    labels: Sequence[int] | npt.NDArray[np.int_],
    groups: Sequence[int] | npt.NDArray[np.int_],
) -> float | None:
    """The AUC of ``values`` counting only pairs of tiles from the same group (hospital): the stratified
    Mann-Whitney statistic, ``sum_h U_h / sum_h n1_h n0_h`` (ties count one half), as ``max(AUC, 1 - AUC)``; mean
    one-vs-rest over more than two classes. ``None`` where no group holds two classes.

    Pooled over hospitals, a statistic also separates the classes when hospitals differ both in stain or scanner
    and in case mix (a pale hospital with more cancer): that is a shortcut for a model shared by the hospitals, but
    not one any single hospital's tiles hold. Within hospitals it is only what the tissue itself gives away.
    """
    from scipy.stats import rankdata

    x = np.asarray(values, dtype=np.float64)
    y = np.asarray(labels)
    g = np.asarray(groups)
    present = np.unique(y)
    if len(present) < 2:
        return None
    results = []
    for k in present[1:] if len(present) == 2 else present:
        wins = pairs = 0.0
        for h in np.unique(g):
            rows = g == h
            positive = y[rows] == k
            n1, n0 = int(positive.sum()), int((~positive).sum())
            if n1 == 0 or n0 == 0:
                continue
            ranks = rankdata(x[rows])
            wins += float(ranks[positive].sum()) - n1 * (n1 + 1) / 2
            pairs += n1 * n0
        if pairs:
            auc = wins / pairs
            results.append(max(auc, 1.0 - auc))
    return float(np.mean(results)) if results else None


def chance_within(
    table: npt.NDArray[np.float64],
    labels: Sequence[int] | npt.NDArray[np.int_],
    slides: Sequence[str] | npt.NDArray[np.str_],
    groups: Sequence[int] | npt.NDArray[np.int_],
    shuffles: int = CHANCE_SHUFFLES,
    seed: int = CHANCE_SEED,
) -> dict[str, Any] | None:
    """How high the worst within-hospital AUC of ``table``'s statistics (tiles x statistics) goes by chance when
    the slides' labels are shuffled within each hospital (module docstring, "Chance on few slides").

    Ranks do not change when labels move, so each hospital's tiles are ranked once per statistic and summed per
    slide; a shuffle then only chooses which slides are positive: ``U = sum of the positive slides' rank sums -
    n1 (n1 + 1) / 2`` and ``pairs = n1 n0``, summed over hospitals as in `within_auc` (row 0 is the observed
    labelling, whose AUCs are `within_auc`'s exactly). Returns ``slides`` (in hospitals holding both classes),
    ``shuffles``, ``worst_within`` (observed), ``chance_95`` and ``p_value`` (``(1 + shuffles at or above the
    observed) / (shuffles + 1)``); ``None`` with other than two classes, where a slide holds tiles of both labels
    (its label is not the slide's), or where no hospital holds both classes.
    """
    from scipy.stats import rankdata

    x = np.asarray(table, dtype=np.float64)
    y = np.asarray(labels)
    names_all = np.asarray(slides)
    g = np.asarray(groups)
    present = np.unique(y)
    if len(present) != 2:
        return None
    rng = np.random.default_rng(seed)
    wins = np.zeros((shuffles + 1, x.shape[1]))
    pairs = np.zeros(shuffles + 1)
    slide_total = 0
    for h in np.unique(g):
        rows = g == h
        _, index = np.unique(names_all[rows], return_inverse=True)
        tiles = np.bincount(index)
        positive_tiles = np.bincount(index, weights=(y[rows] == present[1]).astype(np.float64), minlength=len(tiles))
        if np.any((positive_tiles > 0) & (positive_tiles < tiles)):
            return None
        slide_label = positive_tiles > 0
        if slide_label.all() or not slide_label.any():
            continue
        slide_total += len(tiles)
        ranks = np.column_stack([rankdata(x[rows, k]) for k in range(x.shape[1])])
        rank_sums = np.zeros((len(tiles), x.shape[1]))
        np.add.at(rank_sums, index, ranks)
        drawn = rng.permuted(np.tile(slide_label, (shuffles, 1)), axis=1)
        assign = np.vstack([slide_label, drawn]).astype(np.float64)
        n1 = assign @ tiles
        wins += assign @ rank_sums - (n1 * (n1 + 1) / 2)[:, None]
        pairs += n1 * (tiles.sum() - n1)
    if not pairs[0]:
        return None
    auc = wins / pairs[:, None]
    worst = np.maximum(auc, 1.0 - auc).max(axis=1)
    observed, null = float(worst[0]), worst[1:]
    return {
        "slides": slide_total,
        "shuffles": shuffles,
        "worst_within": round(observed, 4),
        "chance_95": round(float(np.quantile(null, 0.95)), 4),
        "p_value": round(float((1 + np.count_nonzero(null >= observed - 1e-12)) / (shuffles + 1)), 4),
    }


def probe(
    stats: Sequence[tuple[float, ...]],
    labels: Sequence[int],
    splits: Sequence[str],
    hospitals: Sequence[int],
    split_names: Sequence[str],
    slides: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The record of ``prepare.json["shortcut_probe"]`` for tiles given by parallel sequences.

    ``splits``: per split over all hospitals pooled, each statistic's AUC (``None`` where a split has one class)
    and the tile count; ``within_hospitals``: per split, each statistic's AUC over pairs of tiles of one hospital
    (`within_auc`); ``clients``: the same per hospital and split (small splits: read with care); ``worst`` and
    ``worst_within``: the statistic and split with the highest AUC, pooled and within hospitals; ``warning``: one
    line when the pooled AUC exceeds `WARN_AUC`, which says when it is the hospitals' differences that separate;
    ``chance`` (when ``slides`` name each tile's slide): per split, `chance_within`, which the warning quotes for its
    split.
    """
    table = np.asarray(stats, dtype=np.float64).reshape(-1, len(STATISTICS))
    lab = np.asarray(labels)
    spl = np.asarray(splits)
    cli = np.asarray(hospitals)

    def aucs(rows: npt.NDArray[np.bool_], by_hospital: bool = False) -> dict[str, Any]:
        """Each statistic's AUC over ``rows``: all pairs, or (``by_hospital``) pairs of one hospital only."""
        out: dict[str, Any] = {"tiles": int(rows.sum())}
        for k, name in enumerate(STATISTICS):
            if not rows.any():
                auc = None
            elif by_hospital:
                auc = within_auc(table[rows, k], lab[rows], cli[rows])
            else:
                auc = separation_auc(table[rows, k], lab[rows])
            out[name] = None if auc is None else round(auc, 4)
        return out

    pooled = {split: aucs(spl == split) for split in split_names}
    stratified = {split: aucs(spl == split, by_hospital=True) for split in split_names}
    per_hospital = {
        str(c): {split: aucs((cli == c) & (spl == split)) for split in split_names} for c in sorted(set(cli.tolist()))
    }
    worst, worst_within = _worst(pooled), _worst(stratified)
    chance: dict[str, Any] = {}
    if slides is not None:
        names = np.asarray(slides)
        chance = {
            split: chance_within(table[spl == split], lab[spl == split], names[spl == split], cli[spl == split])
            for split in split_names
        }
    warning = None
    if worst is not None and worst["auc"] > WARN_AUC:
        warning = (
            f"shortcut: {DESCRIPTIONS[worst['statistic']]} alone separates the classes of the {worst['split']} "
            f"tiles at AUC {worst['auc']:.3f} (> {WARN_AUC:.2f}); a model can score well here without looking at "
            "tissue (see report.md, 'Shortcut probe')"
        )
        if worst_within is not None and worst_within["auc"] <= WARN_AUC:
            warning += (
                f". Within any one hospital no statistic exceeds AUC {worst_within['auc']:.3f}: the hospitals "
                "differ in stain or scanner and in case mix together, which a model shared by them can exploit"
            )
        warning += chance_sentence(chance.get(worst["split"]), worst["split"])
    record = {
        "statistics": dict(DESCRIPTIONS),
        "warn_above": WARN_AUC,
        "splits": pooled,
        "within_hospitals": stratified,
        "clients": per_hospital,
        "worst": worst,
        "worst_within": worst_within,
        "warning": warning,
    }
    if slides is not None:
        record["chance"] = chance
    return record


def chance_sentence(chance: Mapping[str, Any] | None, split: str) -> str:
    """What the warning adds from a split's `chance_within` record: whether its worst within-hospital statistic is
    beyond what shuffling its slides' labels gives (empty without a record)."""
    if not chance:
        return ""
    verdict = (
        "so few slides cannot tell this from chance"
        if chance["p_value"] > 0.05
        else "beyond what chance gives on this many slides"
    )
    return (
        f". Within hospitals the {split} split's worst statistic reaches {chance['worst_within']:.3f}; shuffling the "
        f"labels of its {chance['slides']} slides gives {chance['chance_95']:.3f} or more in 5% of "
        f"{chance['shuffles']} shuffles (p = {chance['p_value']:.3f}): {verdict}"
    )


def _worst(by_split: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The statistic and split with the highest AUC in ``{split: {statistic: auc}}``."""
    worst: dict[str, Any] | None = None
    for split, row in by_split.items():
        for name in STATISTICS:
            value = row.get(name)
            if value is not None and (worst is None or value > worst["auc"]):
                worst = {"split": split, "statistic": name, "auc": value}
    return worst


def probe_markdown(record: Mapping[str, Any]) -> list[str]:
    """The report's "Shortcut probe" section: one row per statistic, one column per split."""
    splits = list(record["splits"])
    lines = [
        "## Shortcut probe",
        "",
        "How well one label-free pixel statistic alone separates the classes (AUC, 0.5 = not at all, 1.0 = "
        f"perfectly; above {record['warn_above']:.2f} a model need not look at tissue). Pooled over hospitals; "
        "per hospital in prepare.json, `shortcut_probe.clients`.",
        "",
        "| statistic | " + " | ".join(f"{s} ({record['splits'][s]['tiles']} tiles)" for s in splits) + " |",
        "|---|" + "---|" * len(splits),
    ]
    within = record.get("within_hospitals")  # an older record has none
    lines += _statistic_rows(record, record["splits"], splits)
    if within:
        lines += [
            "",
            "Within hospitals (only pairs of tiles of one hospital compared, so that hospitals differing in stain and "
            "case mix together do not count):",
            "",
            "| statistic | " + " | ".join(splits) + " |",
            "|---|" + "---|" * len(splits),
        ]
        lines += _statistic_rows(record, within, splits)
        chance = record.get("chance")  # a record written before the chance test has none
        if chance and any(chance.values()):  # no split could be tested (e.g. slides holding both labels): no rows
            lines += _chance_rows(chance, splits)
    lines += ["", f"**Warning:** {record['warning']}" if record["warning"] else "No statistic exceeds the limit.", ""]
    return lines


def _chance_rows(chance: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    """The within table's last rows: per split, the chance level of its worst statistic and the p-value
    (`chance_within`)."""
    cells = [chance.get(s) for s in splits]
    shuffles = next((c["shuffles"] for c in cells if c), 0)
    return [
        f"| chance: the worst statistic's AUC exceeded in 5% of {shuffles} shuffles of the slides' labels (slides) | "
        + " | ".join("n/a" if not c else f"{c['chance_95']:.3f} ({c['slides']})" for c in cells)
        + " |",
        "| p-value of the worst statistic against those shuffles | "
        + " | ".join("n/a" if not c else f"{c['p_value']:.3f}" for c in cells)
        + " |",
    ]


def _statistic_rows(
    record: Mapping[str, Any], by_split: Mapping[str, Mapping[str, Any]], splits: Sequence[str]
) -> list[str]:
    """One markdown row per statistic the record names (an older record names fewer), one cell per split."""
    rows = []
    for name, description in record["statistics"].items():
        cells = [by_split.get(s, {}).get(name) for s in splits]
        rows.append(f"| {description} | " + " | ".join("n/a" if v is None else f"{v:.3f}" for v in cells) + " |")
    return rows


def prepared_statistics(
    folder: Path, white_level: int = 220, split: str | None = None
) -> tuple[list[dict[str, str]], list[tuple[float, ...]]]:
    """The ``manifest.csv`` rows of a prepared dataset (only ``split``'s when given) and each tile's `STATISTICS`,
    read from its stored PNG. `PipelineError` naming a tile that cannot be read."""
    import csv

    import cv2

    from pipeline.errors import PipelineError

    with (folder / MANIFEST_FILE).open(newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if split is None or r["split"] == split]
    stats = []
    for row in rows:
        pixels = cv2.imread(str(folder / row["path"]), cv2.IMREAD_UNCHANGED)
        if pixels is None:
            raise PipelineError(f"{folder / row['path']}: cannot read this tile; re-run gastric-fl prepare")
        rgb = pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
        stats.append(tile_statistics(np.asarray(rgb, dtype=np.uint8), white_level))
    return rows, stats


def probe_prepared(folder: Path, white_level: int = 220) -> dict[str, Any]:
    """The probe of an already prepared dataset, from its ``manifest.csv`` and tile PNGs (a dataset prepared before
    prepare recorded the probe, or one to check again). `PipelineError` naming a tile that cannot be read."""
    rows, stats = prepared_statistics(folder, white_level)
    classes = sorted({r["label"] for r in rows}, key=lambda name: (name != "normal", name))
    index = {name: k for k, name in enumerate(classes)}
    splits = tuple(s for s in ("train", "val", "test") if any(r["split"] == s for r in rows))
    return probe(
        stats,
        [index[r["label"]] for r in rows],
        [r["split"] for r in rows],
        [int(r["client"]) for r in rows],
        splits,
        slides=[r["source"] for r in rows],
    )
