"""The shortcut probe (`pipeline.probe`): exact statistics by hand, a planted shortcut found, none where none is."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.probe import (
    CHANCE_SHUFFLES,
    DESCRIPTIONS,
    STATISTICS,
    WARN_AUC,
    chance_sentence,
    chance_within,
    probe,
    probe_markdown,
    separation_auc,
    tile_statistics,
    within_auc,
)

# The statistics prepare recorded before std_intensity, mean_saturation and dark_fraction were added.
OLD_STATISTICS = ("pure_white", "near_white", "mean_intensity", "mean_red", "mean_green", "mean_blue")


def test_tile_statistics_by_hand() -> None:
    tile = np.array([[[255, 255, 255], [230, 240, 221]], [[10, 20, 30], [255, 255, 254]]], dtype=np.uint8)
    pure, near, mean, red, green, blue, *_ = tile_statistics(tile, 220)
    assert pure == 0.25  # only the first pixel has every channel at 255
    assert near == 0.75  # (230, 240, 221) and (255, 255, 254) are near-white too
    assert mean == pytest.approx(tile.mean())
    assert (red, green, blue) == (pytest.approx(187.5), pytest.approx(192.5), pytest.approx(190.0))
    gray = np.array([[255, 100], [100, 100]], dtype=np.uint8)
    # gray values 255, 100, 100, 100: mean 138.75, deviations 116.25 and -38.75 (three times) -> variance
    # (13514.0625 + 3 * 1501.5625) / 4 = 4504.6875; no saturation; 100 is not below 100: no dark pixel
    assert tile_statistics(gray, 220) == (
        0.25,
        0.25,
        138.75,
        138.75,
        138.75,
        138.75,
        pytest.approx(math.sqrt(4504.6875), abs=1e-12),
        0.0,
        0.0,
    )


def test_the_added_statistics_by_hand_on_rgb() -> None:
    tile = np.array([[[200, 100, 0], [0, 0, 0]], [[100, 100, 99], [240, 240, 180]]], dtype=np.uint8)
    *_, std, saturation, dark = tile_statistics(tile, 220)
    # channel sums 300, 0, 299, 660 (gray = sum / 3): mean 314.75, deviations -14.75, -314.75, -15.75, 345.25 ->
    # squares 217.5625 + 99067.5625 + 248.0625 + 119197.5625 = 218730.75, variance 54682.6875 (ddof 0)
    assert std == pytest.approx(math.sqrt(54682.6875) / 3, abs=1e-12)
    # (max - min) / max: 200 / 200 = 1, black pixel 0 (max 0), 1 / 100 = 0.01, 60 / 240 = 0.25 -> mean 0.315
    assert saturation == pytest.approx(0.315, abs=1e-15)
    # gray 100 (sum 300) is not dark; 0 and 99.67 (sum 299) are
    assert dark == 0.5
    gray = np.array([[255, 99], [100, 0], [40, 160]], dtype=np.uint8)
    *_, std, saturation, dark = tile_statistics(gray, 220)
    # values 255, 99, 100, 0, 40, 160: mean 109, deviations 146, -10, -9, -109, -69, 51 ->
    # squares 21316 + 100 + 81 + 11881 + 4761 + 2601 = 40740, variance 6790
    assert std == pytest.approx(math.sqrt(6790), abs=1e-12)
    assert saturation == 0.0  # gray: max == min in every pixel
    assert dark == 0.5  # 99, 0 and 40 are below 100
    assert len(tile_statistics(tile, 220)) == len(STATISTICS) == len(DESCRIPTIONS)


def test_separation_auc_is_oriented_and_undefined_for_one_class() -> None:
    assert separation_auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert separation_auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 1.0  # usable in either direction
    # One of the four (normal, abnormal) pairs is misordered: AUC 3/4.
    assert separation_auc([0.1, 0.6, 0.5, 0.9], [0, 0, 1, 1]) == 0.75
    assert separation_auc([0.1, 0.2], [1, 1]) is None


def _tiles(rng: np.random.Generator, n: int, painted: float) -> list[np.ndarray]:
    """Tissue-like noise tiles; ``painted``: share of tiles with a pure-white corner painted in (the shortcut)."""
    out = []
    for k in range(n):
        tile = rng.integers(120, 200, size=(16, 16, 3), dtype=np.uint8)
        if k < painted * n:
            tile[:6, :6] = 255
        out.append(tile)
    return out


def _record(normal: list[np.ndarray], abnormal: list[np.ndarray]) -> dict:  # type: ignore[type-arg]
    tiles = normal + abnormal
    labels = [0] * len(normal) + [1] * len(abnormal)
    splits = ["test"] * len(tiles)
    clients = [k % 2 for k in range(len(tiles))]
    return probe([tile_statistics(t, 220) for t in tiles], labels, splits, clients, ("train", "test"))


def test_a_planted_shortcut_is_found_and_warned_about() -> None:
    rng = np.random.default_rng(0)
    record = _record(_tiles(rng, 60, 0.0), _tiles(rng, 60, 0.95))
    test = record["splits"]["test"]
    assert test["pure_white"] > 0.95
    assert test["near_white"] > 0.95
    assert record["worst"]["split"] == "test"
    assert record["worst"]["auc"] > WARN_AUC
    assert record["warning"] is not None
    assert "test tiles at AUC" in record["warning"]
    assert record["splits"]["train"] == {"tiles": 0, **dict.fromkeys(STATISTICS)}  # no train tiles: undefined
    assert set(record["clients"]) == {"0", "1"}
    json.dumps(record)  # JSON-ready for prepare.json


def test_no_shortcut_reads_near_one_half_and_does_not_warn() -> None:
    rng = np.random.default_rng(1)
    record = _record(_tiles(rng, 200, 0.5), _tiles(rng, 200, 0.5))
    for name in STATISTICS:
        assert 0.5 <= record["splits"]["test"][name] < 0.6, name
    assert record["warning"] is None


def test_the_dark_pixel_share_separates_where_the_mean_intensity_does_not() -> None:
    """Abnormal tiles each hold nuclear-dark pixels, normal ones none, at the same mean intensities: only
    dark_fraction separates, and it is what raises the warning (the six older statistics would not)."""
    values = {
        0: [[110, 110, 110, 110], [100, 100, 160, 160], [120, 120, 140, 140], [100, 100, 200, 200]],
        1: [[80, 120, 120, 120], [90, 130, 130, 170], [60, 140, 160, 160], [96, 168, 168, 168]],
    }
    tiles = [np.array(v, dtype=np.uint8).reshape(2, 2) for label in (0, 1) for v in values[label]]
    labels = [0] * 4 + [1] * 4
    record = probe([tile_statistics(t, 220) for t in tiles], labels, ["test"] * 8, [0, 1] * 4, ("test",))
    test = record["splits"]["test"]
    # means 110, 130, 130, 150 in both classes: no separation at all
    assert test["mean_intensity"] == test["mean_red"] == 0.5
    # std: normal 0, 30, 10, 50; abnormal 17.3, 28.3, 41.2, 31.2 -> abnormal above normal in 10 of 16 pairs
    assert test["std_intensity"] == 0.625
    assert test["pure_white"] == test["near_white"] == test["mean_saturation"] == 0.5  # all equal: ties
    assert test["dark_fraction"] == 1.0  # normal 0 dark pixels, abnormal 1 or more of 4
    assert max(test[name] for name in OLD_STATISTICS) < WARN_AUC
    assert record["worst"] == {"split": "test", "statistic": "dark_fraction", "auc": 1.0}
    assert record["warning"] is not None
    assert record["warning"].startswith(f"shortcut: {DESCRIPTIONS['dark_fraction']} alone separates")


def _older_record() -> dict:  # type: ignore[type-arg]
    """A probe record as prepare wrote it before the three added statistics: their keys absent everywhere."""
    rng = np.random.default_rng(0)
    record = _record(_tiles(rng, 10, 0.0), _tiles(rng, 10, 0.9))
    old = json.loads(json.dumps(record))
    old["statistics"] = {k: v for k, v in old["statistics"].items() if k in OLD_STATISTICS}
    del old["within_hospitals"], old["worst_within"]  # added later still
    for row in [*old["splits"].values(), *(r for c in old["clients"].values() for r in c.values())]:
        for name in set(STATISTICS) - set(OLD_STATISTICS):
            del row[name]
    return old  # type: ignore[no-any-return]


def test_a_record_with_only_the_older_statistics_still_reads(tmp_path: Path) -> None:
    from app.datasets import shortcut_probe
    from app.report_html.page import _shortcut

    old = _older_record()
    lines = probe_markdown(old)
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| statistic")]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [DESCRIPTIONS[n] for n in OLD_STATISTICS]
    assert f"{old['splits']['test']['pure_white']:.3f}" in rows[0]
    shown = shortcut_probe({"shortcut_probe": old})
    assert shown is not None
    assert shown.table["statistic"].tolist() == [DESCRIPTIONS[n] for n in OLD_STATISTICS]
    assert shown.table["test AUC (20 tiles)"].tolist() == [old["splits"]["test"][n] for n in OLD_STATISTICS]
    (tmp_path / "prepare.json").write_text(json.dumps({"shortcut_probe": old}), encoding="utf-8")
    page = _shortcut(tmp_path)
    assert page.count("<tr>") == 1 + len(OLD_STATISTICS)
    assert DESCRIPTIONS["dark_fraction"] not in page
    # a record of today lists all nine
    rng = np.random.default_rng(0)
    today = probe_markdown(_record(_tiles(rng, 10, 0.0), _tiles(rng, 10, 0.9)))
    within_block = 5 + len(STATISTICS)  # blank, sentence, blank, header, rule, one row per statistic
    assert len(today) == len(lines) + len(STATISTICS) - len(OLD_STATISTICS) + within_block
    assert any(line.startswith(f"| {DESCRIPTIONS['dark_fraction']} |") for line in today)


def test_prepare_records_the_probe_and_warns_on_a_masked_dataset(tmp_path: Path) -> None:
    from pipeline.config import build_config
    from pipeline.prepare import prepare_dataset
    from pipeline.synth import generate_dataset

    raw = tmp_path / "raw"
    generate_dataset(raw, "seed", images=12, seed=4, size=256)

    def run(out: Path, masked: bool) -> dict:  # type: ignore[type-arg]
        config = build_config(
            None,
            {
                "source": {"format": "seed", "input": raw},
                "split": {"clients": 2, "sizes": "equal"},
                "tiles": {"tile": 64, "mask_outside": masked},
                "output": {"out": out},
            },
        )
        result = prepare_dataset(config)
        record = json.loads((out / "prepare.json").read_text())
        assert record["shortcut_probe"]["warning"] == result.shortcut_warning
        assert "## Shortcut probe" in (out / "report.md").read_text()
        return record["shortcut_probe"]  # type: ignore[no-any-return]

    masked = run(tmp_path / "masked", True)
    raw_probe = run(tmp_path / "raw_tiles", False)
    # Step a.1 paints white into the abnormal training tiles: the pure-white share then separates train almost
    # perfectly, while the raw test tiles (never masked) and the raw dataset show no such separation.
    assert masked["splits"]["train"]["pure_white"] > 0.9
    assert masked["warning"] is not None
    assert raw_probe["splits"]["train"]["pure_white"] < 0.7
    assert masked["splits"]["test"]["pure_white"] == raw_probe["splits"]["test"]["pure_white"]
    # the chance test ran on every split, over the slides of hospitals that hold both classes there
    manifest = (tmp_path / "raw_tiles" / "manifest.csv").read_text().splitlines()[1:]
    for split in ("train", "val", "test"):
        rows = [line.split(",") for line in manifest if line.split(",")[1] == split]
        both = {h for h in {r[0] for r in rows} if len({r[2] for r in rows if r[0] == h}) == 2}
        slides = {(r[0], r[4]) for r in rows if r[0] in both}
        chance = raw_probe["chance"][split]
        assert (chance is None) == (not slides)
        if chance is not None:
            assert chance["slides"] == len(slides)
            assert chance["worst_within"] == max(raw_probe["within_hospitals"][split][n] for n in STATISTICS)


def test_a_mask_outside_dataset_is_named_wherever_its_results_carry_the_intended_use(tmp_path: Path) -> None:
    from infra.provenance import INTENDED_USE, MASKED_NOTE, intended_use

    dataset = tmp_path / "prepared"
    dataset.mkdir()
    (dataset / "prepare.json").write_text(json.dumps({"synthetic": False, "labels": {"departure": None}}))
    assert intended_use(dataset) == INTENDED_USE
    (dataset / "prepare.json").write_text(json.dumps({"synthetic": False, "labels": {"departure": "whitened"}}))
    assert intended_use(dataset) == f"{INTENDED_USE} {MASKED_NOTE}"


def test_within_hospital_auc_counts_only_pairs_of_one_hospital() -> None:
    """Hospital 0: abnormal 3, 4 over normal 1, 2 (4 of 4 pairs); hospital 1: abnormal 1 under normal 2, 3 (0 of 2);
    hospital 2 has one class and adds no pair: 4 / 6. Pooled, the first seven give 8 / 12 (ties count one half)."""
    values = [3.0, 4.0, 1.0, 2.0, 1.0, 2.0, 3.0, 9.0]
    labels = [1, 1, 0, 0, 1, 0, 0, 1]
    groups = [0, 0, 0, 0, 1, 1, 1, 2]
    assert within_auc(values, labels, groups) == pytest.approx(4 / 6)
    assert within_auc(values[:7], labels[:7], [0] * 7) == pytest.approx(8 / 12)
    assert within_auc([1.0, 2.0], [1, 1], [0, 1]) is None
    assert within_auc([1.0, 2.0, 3.0, 4.0], [1, 0, 1, 0], [0, 0, 1, 1]) == pytest.approx(1.0)  # lower = abnormal


def test_a_site_and_case_mix_confound_is_named_in_the_warning() -> None:
    """A bright hospital with 8 abnormal tiles of 10 and a dim one with 2: within each, every tile has the same
    statistics (AUC 0.5); pooled, brightness separates the classes at 80 / 100 pairs (ties count one half)."""
    stats, labels, clients = [], [], []
    for client, level, abnormal in ((0, 200.0, 8), (1, 120.0, 2)):
        for k in range(10):
            stats.append((0.0, 0.0, level, level, level, level, 10.0, 0.2, 0.0))
            labels.append(int(k < abnormal))
            clients.append(client)
    record = probe(stats, labels, ["test"] * 20, clients, ("test",))
    assert record["worst"]["auc"] == pytest.approx(0.8)
    assert record["worst_within"]["auc"] == pytest.approx(0.5)
    assert "Within any one hospital no statistic exceeds AUC 0.500" in record["warning"]


def _slides_case(seed: int) -> tuple[np.ndarray, list[int], list[str], list[int]]:
    """Two hospitals of unequal slides and tiles per slide, every tile labelled as its slide, random statistics."""
    rng = np.random.default_rng(seed)
    table, labels, slides, groups = [], [], [], []
    for hospital, layout in ((0, [(1, 3), (0, 5), (1, 2), (0, 4), (0, 1)]), (1, [(0, 6), (1, 2), (1, 3)])):
        for number, (label, tiles) in enumerate(layout):
            for _ in range(tiles):
                table.append(rng.normal(size=len(STATISTICS)))
                labels.append(label)
                slides.append(f"slide_{number}")  # names repeat across hospitals: slides are per hospital
                groups.append(hospital)
    return np.array(table), labels, slides, groups


def test_the_chance_test_observed_row_is_the_within_hospital_auc() -> None:
    table, labels, slides, groups = _slides_case(3)
    chance = chance_within(table, labels, slides, groups)
    assert chance is not None
    observed = max(within_auc(table[:, k], labels, groups) or 0.0 for k in range(len(STATISTICS)))
    assert chance["worst_within"] == round(observed, 4)
    assert chance["slides"] == 8
    assert chance["shuffles"] == CHANCE_SHUFFLES
    assert 1 / (CHANCE_SHUFFLES + 1) <= chance["p_value"] <= 1.0
    assert chance == chance_within(table, labels, slides, groups)  # a fixed seed: the record is reproducible


def test_two_slides_give_chance_equal_to_what_is_observed() -> None:
    """One hospital, one slide of each label: a shuffle keeps or swaps the two, and max(AUC, 1 - AUC) is the same
    either way (6 of 6 pairs, or 0 of 6), so every shuffle reaches the observed AUC: chance_95 is it and p is 1.
    A second such hospital would not do: a swap at one hospital only gives (0 + 1) / 7, oriented 6 / 7."""
    table = np.array([[1.0], [2.0], [5.0], [6.0], [7.0]])
    chance = chance_within(table, [0, 0, 1, 1, 1], ["a", "a", "b", "b", "b"], [0] * 5, shuffles=99)
    assert chance == {"slides": 2, "shuffles": 99, "worst_within": 1.0, "chance_95": 1.0, "p_value": 1.0}
    two = chance_within(
        np.array([[1.0], [2.0], [5.0], [6.0], [7.0], [3.0], [4.0]]),
        [0, 0, 1, 1, 1, 0, 1],
        ["a", "a", "b", "b", "b", "c", "d"],
        [0, 0, 0, 0, 0, 1, 1],
        shuffles=99,
    )
    assert two is not None
    assert two["chance_95"] == 1.0  # half the shuffles keep both hospitals' directions alike
    assert 0.2 < two["p_value"] < 0.8  # the other half reach only 6 / 7


def test_a_shortcut_over_many_slides_is_beyond_chance_and_a_mixed_slide_has_no_test() -> None:
    table, labels, slides, groups = [], [], [], []
    for number in range(20):
        for tile in range(3):
            table.append([number % 2 + 0.1 * tile])  # odd slides are abnormal and brighter: AUC 1
            labels.append(number % 2)
            slides.append(f"s{number}")
            groups.append(0)
    chance = chance_within(np.array(table), labels, slides, groups)
    assert chance is not None
    assert chance["worst_within"] == 1.0
    assert chance["p_value"] < 0.01
    assert chance["chance_95"] < 0.85
    labels[0] = 1  # slide s0 now holds both labels: its label is not the slide's, and shuffling slides is not valid
    assert chance_within(np.array(table), labels, slides, groups) is None
    assert chance_within(np.array(table), [k % 3 for k in range(60)], slides, groups) is None  # three classes
    assert chance_within(np.array(table), [1] * 60, slides, groups) is None  # one class


def test_the_warning_says_whether_chance_explains_the_worst_statistic() -> None:
    few = {"slides": 12, "shuffles": 999, "worst_within": 0.74, "chance_95": 0.79, "p_value": 0.2}
    many = {**few, "slides": 80, "chance_95": 0.62, "p_value": 0.001}
    assert chance_sentence(few, "val") == (
        ". Within hospitals the val split's worst statistic reaches 0.740; shuffling the labels of its 12 slides "
        "gives 0.790 or more in 5% of 999 shuffles (p = 0.200): so few slides cannot tell this from chance"
    )
    assert chance_sentence(many, "test").endswith("(p = 0.001): beyond what chance gives on this many slides")
    assert chance_sentence(None, "val") == ""
    # probe() quotes the warned split's chance test, and the report's within table shows it for every split
    stats, labels, clients, names = [], [], [], []
    for number in range(6):
        for _ in range(4):
            level = 200.0 if number % 2 else 100.0
            stats.append((0.0, 0.0, level, level, level, level, 10.0, 0.2, 0.0))
            labels.append(number % 2)
            clients.append(0)
            names.append(f"s{number}")
    record = probe(stats, labels, ["test"] * 24, clients, ("test",), slides=names)
    assert record["chance"]["test"]["slides"] == 6
    assert record["warning"].endswith(chance_sentence(record["chance"]["test"], "test"))
    lines = probe_markdown(record)
    assert any(line.startswith("| chance: the worst statistic's AUC exceeded in 5% of 999 shuffles") for line in lines)
    assert "chance" not in probe(stats, labels, ["test"] * 24, clients, ("test",))  # no slides given: no test
    untestable = probe(stats, labels, ["test"] * 24, clients, ("test",), slides=["one slide"] * 24)
    assert untestable["chance"] == {"test": None}  # one slide holding both labels: no valid shuffle
    assert not any("shuffles" in line for line in probe_markdown(untestable))
