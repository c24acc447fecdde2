"""The tissue description (`models.shift`) on features of known distribution, its file, and the words of a call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from models.decision import (
    FALSE_ALARM,
    FOCUS_CALL,
    MISSED_CANCER,
    UNFAMILIAR_CALL,
    outcome,
    reported_call,
)
from models.names import TISSUE_FILE
from models.shift import (
    TISSUE_VERSION,
    TissueError,
    _fit,
    fit_description,
    fold_of_slides,
    mahalanobis,
    read_description,
    write_description,
)


def _slides(rng: np.random.Generator, count: int, per: int, shift: float = 0.0) -> tuple[np.ndarray, list[str]]:
    """``count`` slides of ``per`` tiles in 12 dimensions: each slide's own offset (slides differ) plus tile noise."""
    rows, names = [], []
    for s in range(count):
        offset = rng.normal(0.0, 0.5, 12) + shift
        rows.append(offset + rng.normal(0.0, 1.0, (per, 12)))
        names += [f"s{s}"] * per
    return np.concatenate(rows), names


def test_new_slides_of_the_same_tissue_are_familiar_and_shifted_ones_are_not() -> None:
    rng = np.random.default_rng(0)
    features, slides = _slides(rng, 20, 40)
    description = fit_description(features, slides, "features.0")
    assert description.tiles == 800
    assert description.slides == 20
    new, _ = _slides(rng, 10, 40)
    assert description.unfamiliar(new).mean() <= 0.05
    shifted, _ = _slides(rng, 10, 40, shift=2.0)
    assert description.unfamiliar(shifted).mean() >= 0.90
    # calibrated on tiles the fit had seen, the threshold would be tighter: out-of-fold distances are larger
    seen = np.quantile(description.distances(features), description.quantile)
    assert description.threshold > seen


def test_the_description_round_trips_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    features, slides = _slides(rng, 6, 20)
    description = fit_description(features, slides, "features.0", round=7)
    write_description(tmp_path, description)
    back = read_description(tmp_path)
    assert back is not None
    assert back.layer == "features.0"
    assert back.round == 7
    assert back.threshold == description.threshold
    np.testing.assert_array_equal(back.precision, description.precision)
    assert read_description(tmp_path / "absent") is None
    save_file({"mean": np.zeros(3)}, str(tmp_path / TISSUE_FILE), metadata={"format": "something else"})
    with pytest.raises(TissueError, match=f"{tmp_path / TISSUE_FILE} is not a tissue description"):
        read_description(tmp_path)
    # a description of other statistics (an earlier version's) would measure distances in the wrong space
    save_file(
        {"mean": description.mean, "precision": description.precision},
        str(tmp_path / TISSUE_FILE),
        metadata={"format": "gastric-fl tissue description", "format_version": "1", "statistic": "channel mean"},
    )
    with pytest.raises(TissueError, match="describes other statistics \\('channel mean'\\)"):
        read_description(tmp_path)
    (tmp_path / TISSUE_FILE).write_bytes(b"\x00" * 10)
    with pytest.raises(TissueError, match="is not a readable safetensors file"):
        read_description(tmp_path)


def test_too_few_tiles_or_non_finite_statistics_describe_nothing() -> None:
    with pytest.raises(TissueError, match="3 tiles cannot describe"):
        fit_description(np.zeros((3, 4)), ["a", "a", "b"], "features.0")
    bad = np.ones((10, 4))
    bad[2, 1] = np.nan
    with pytest.raises(TissueError, match="NaN or infinite"):
        fit_description(bad, ["a"] * 10, "features.0")


def test_one_set_of_words_for_a_call() -> None:
    assert outcome("abnormal", "normal") == MISSED_CANCER == "MISSED CANCER"
    assert outcome("normal", "abnormal") == FALSE_ALARM == "FALSE ALARM"
    assert outcome("abnormal", "abnormal") == ""
    assert outcome("", "normal") == ""
    # a normal call holding a tile at the threshold asks for review; an abnormal call does not need the flag
    focus = reported_call("normal", 0.5, 0.5, 0.0)
    assert (focus.words, focus.review, focus.focus) == (FOCUS_CALL, True, True)
    assert reported_call("abnormal", 0.9, 0.5, 0.0).words == "abnormal"
    assert reported_call("normal", 0.49, 0.5, None).words == "normal"
    # above the limit (0.5), never a bare call; at it, still the call
    strange = reported_call("abnormal", 0.9, 0.5, 0.51)
    assert (strange.words, strange.review, strange.unfamiliar) == (UNFAMILIAR_CALL, True, True)
    assert reported_call("abnormal", 0.9, 0.5, 0.5).words == "abnormal"


def test_a_description_from_few_tiles_says_it_may_miss_unfamiliar_tissue() -> None:
    rng = np.random.default_rng(2)
    few, few_slides = _slides(rng, 4, 10)  # 40 tiles for 12 statistics: fewer than 5 each
    weak = fit_description(few, few_slides, "features.0")
    assert weak.weak
    assert "too few tiles for its 12 statistics" in weak.words()
    many, many_slides = _slides(rng, 6, 20)  # 120 tiles: 10 each
    strong = fit_description(many, many_slides, "features.0")
    assert not strong.weak
    assert "too few" not in strong.words()


def test_the_scale_ratio_of_hand_made_tiles() -> None:
    import torch

    from models.features import LOG_FLOOR, scale_ratio

    # a ramp across (0, 1, 2, 3 in every row): change 1 across and 0 down at distance 1 (mean 0.5), 2 and 0 at
    # distance 2 (mean 1.0); a checkerboard: change 1 at distance 1 and none at distance 2
    ramp = torch.arange(4.0).repeat(4, 1)
    checker = (torch.arange(4.0)[:, None] + torch.arange(4.0)[None, :]) % 2
    ratios = scale_ratio(torch.stack([ramp, checker])[:, None])
    assert ratios.shape == (2, 1)
    assert ratios.dtype == torch.float64
    assert ratios[0, 0].item() == pytest.approx(np.log(1.0 + LOG_FLOOR) - np.log(0.5 + LOG_FLOOR), rel=1e-6)
    assert ratios[1, 0].item() == pytest.approx(np.log(LOG_FLOOR) - np.log(1.0 + LOG_FLOOR), rel=1e-6)
    # the same checkerboard enlarged twice (each pixel a 2 x 2 block, 8 x 8): half the neighbours now agree,
    # positions two apart never do: change 3/7 at distance 1 (across and down alike), 1 at distance 2
    enlarged = checker.repeat_interleave(2, 0).repeat_interleave(2, 1)
    (big,) = scale_ratio(enlarged[None, None])[0]
    assert big.item() == pytest.approx(np.log(1.0 + LOG_FLOOR) - np.log(3 / 7 + LOG_FLOOR), rel=1e-6)
    # a stain's intensity scales both changes alike: the ratio stays (but for the floor)
    assert scale_ratio(3.0 * enlarged[None, None])[0, 0].item() == pytest.approx(big.item(), abs=2e-3)


def test_an_enlarged_tile_is_unfamiliar_where_the_original_is_not() -> None:
    import torch

    from models import create_model
    from models.features import tile_statistics

    torch.manual_seed(0)
    model = create_model("mobilenet_v3_small")
    rng = np.random.default_rng(0)

    def tiles(count: int, enlarge: bool = False) -> torch.Tensor:
        """Fine-grained tissue-like noise (each pixel its own), 64 px; enlarged: a 32 px patch at 2x."""
        noise = torch.from_numpy(rng.normal(0.0, 1.0, (count, 3, 64, 64))).float()
        if enlarge:
            noise = noise[:, :, :32, :32].repeat_interleave(2, 2).repeat_interleave(2, 3)
        return noise

    known = tile_statistics(model, "features.0", [tiles(60)], scale=True)
    assert known.shape == (60, 3 * 16 + 3)  # the stem's 16 channels, then one scale ratio per colour channel
    description = fit_description(known, [f"s{i // 6}" for i in range(60)], "features.0")
    assert description.version == TISSUE_VERSION == 3
    assert description.scale
    new = description.unfamiliar(tile_statistics(model, "features.0", [tiles(10)], scale=True))
    enlarged = description.unfamiliar(tile_statistics(model, "features.0", [tiles(10, enlarge=True)], scale=True))
    assert int(new.sum()) == 0
    assert int(enlarged.sum()) == 10


def test_a_tile_is_judged_with_its_grid_neighbours_from_version_2_on() -> None:
    from models.shift import TilePositions, TissueDescription, neighbourhood_median

    # a 3 x 3 grid at step 64 (row by row) and a lone tile 2 steps to the right of the top row's end
    xs = np.array([0, 64, 128, 0, 64, 128, 0, 64, 128, 256], dtype=np.int64)
    ys = np.array([0, 0, 0, 64, 64, 64, 128, 128, 128, 0], dtype=np.int64)
    grid = TilePositions(xs, ys, 64)
    distances = np.array([1.0, 2.0, 3.0, 4.0, 50.0, 6.0, 7.0, 8.0, 9.0, 40.0])
    pooled = neighbourhood_median(distances, grid)
    # corner (0, 0): itself, (64, 0), (0, 64), (64, 64): 1, 2, 4, 50 -> 3.0; (0, 64): 1, 2, 4, 7, 8, 50 -> 5.5;
    # the centre: all nine -> 6.0; the lone tile: itself
    np.testing.assert_array_equal(pooled, [3.0, 3.5, 4.5, 5.5, 6.0, 7.0, 7.5, 7.5, 8.5, 40.0])
    v2 = TissueDescription("features.0", np.zeros(2), np.eye(2), threshold=10.0)
    v1 = TissueDescription("features.0", np.zeros(2), np.eye(2), threshold=10.0, version=1)
    # the outlier in the middle of familiar tissue is familiar by its neighbourhood; alone, it is unfamiliar
    assert v2.marks(distances, grid).tolist() == [False] * 9 + [True]
    assert v1.marks(distances, grid).tolist() == [False] * 4 + [True] + [False] * 4 + [True]
    assert v2.marks(distances).tolist() == v1.marks(distances, grid).tolist()  # no grid: each tile alone
    with pytest.raises(TissueError, match="9 values for 10 tile positions"):
        neighbourhood_median(distances[:9], grid)


def test_a_version_1_description_still_reads_and_scores_as_before(tmp_path: Path) -> None:
    from models.shift import STATISTICS

    rng = np.random.default_rng(3)
    features, slides = _slides(rng, 6, 20)
    old = fit_description(features, slides, "features.0", round=4, version=1)
    write_description(tmp_path, old)
    from safetensors import safe_open

    with safe_open(str(tmp_path / TISSUE_FILE), framework="numpy") as handle:
        metadata = handle.metadata()
    assert (metadata["format_version"], metadata["statistic"]) == ("1", STATISTICS[1])
    back = read_description(tmp_path)
    assert back is not None
    assert (back.version, back.scale, back.round, back.mean.size) == (1, False, 4, 12)
    shifted, _ = _slides(rng, 2, 20, shift=2.0)
    np.testing.assert_array_equal(back.distances(shifted), old.distances(shifted))
    assert back.unfamiliar(shifted).tolist() == (old.distances(shifted) > old.threshold).tolist()
    with pytest.raises(TissueError, match="version 4 is unknown"):
        fit_description(features, slides, "features.0", version=4)


def test_version_3_distances_do_not_depend_on_each_statistics_units_and_version_2_did() -> None:
    # few tiles for their statistics (strong shrinkage): Ledoit-Wolf on raw statistics shrinks towards one average
    # variance, so a statistic's unit changes every distance; on standardised statistics it changes none
    rng = np.random.default_rng(5)
    features, slides = _slides(rng, 4, 6)
    units = np.array([1.0, 1e-3, 50.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 7.0, 0.2])
    new, _ = _slides(rng, 2, 6, shift=1.0)
    for version, same in ((3, True), (2, False)):
        plain = fit_description(features, slides, "features.0", version=version)
        scaled = fit_description(features * units, slides, "features.0", version=version)
        close = np.allclose(plain.distances(new), scaled.distances(new * units), rtol=1e-9)
        assert close is same, version
        assert bool(np.isclose(plain.threshold, scaled.threshold, rtol=1e-9)) is same, version


def test_the_standardised_fit_is_ledoit_wolf_on_the_correlations_in_the_statistics_units() -> None:
    from sklearn.covariance import LedoitWolf

    x = np.array([[1.0, 10.0, 0.1], [2.0, 30.0, 0.4], [4.0, 20.0, 0.2], [3.0, 60.0, 0.3], [5.0, 40.0, 0.9]])
    mean, precision = _fit(x)
    spread = x.std(axis=0)
    np.testing.assert_allclose(spread, [np.sqrt(2.0), np.sqrt(296.0), np.sqrt(0.0776)])
    expected = LedoitWolf().fit(x / spread).precision_ / np.outer(spread, spread)
    np.testing.assert_allclose(precision, expected, rtol=1e-12)
    np.testing.assert_allclose(mean, [3.0, 32.0, 0.38], rtol=1e-12)
    # a statistic that never varied gets a floor, not a division by zero
    flat = x.copy()
    flat[:, 2] = 0.5
    _, floored = _fit(flat)
    assert np.isfinite(floored).all()


def test_a_hospital_with_no_more_slides_than_folds_is_calibrated_on_its_slides_typical_tile() -> None:
    rng = np.random.default_rng(6)
    features, slides = _slides(rng, 4, 6)
    description = fit_description(features, slides, "features.0")
    assert (description.calibration, description.slides) == ("slide", 4)
    # by hand: each slide left out (4 slides, 5 folds: one slide a fold), its tiles' distances from the others' fit,
    # then each tile takes its slide's median, then the 0.98 point
    fold = fold_of_slides(slides, 5)
    assert sorted(set(fold.tolist())) == [0, 1, 2, 3]
    held = np.empty(len(slides))
    for k in range(4):
        mine = fold == k
        mu, p = _fit(features[~mine])
        held[mine] = np.median(mahalanobis(features[mine], mu, p))
    assert description.threshold == pytest.approx(float(np.quantile(held, 0.98)), rel=1e-12)
    # single tiles would have given a higher threshold: the left-out slide's most extreme tile
    single = fit_description(features, slides, "features.0", version=2)
    assert single.calibration == "tile"
    assert single.threshold > description.threshold
    many, names = _slides(rng, 6, 6)
    assert fit_description(many, names, "features.0").calibration == "tile"
    assert "typical (median)" in description.words()
    assert "typical" not in fit_description(many, names, "features.0").words()


def test_the_calibration_round_trips_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    from dataclasses import replace

    rng = np.random.default_rng(7)
    features, slides = _slides(rng, 3, 8)
    description = fit_description(features, slides, "features.0")
    write_description(tmp_path, description)
    back = read_description(tmp_path)
    assert back is not None
    assert (back.version, back.calibration) == (3, "slide")
    # a version 2 file (no calibration in its metadata) reads as calibrated tile by tile, as it was
    older = fit_description(features, slides, "features.0", version=2)
    write_description(tmp_path, older)
    from safetensors import safe_open

    with safe_open(str(tmp_path / TISSUE_FILE), framework="numpy") as handle:
        metadata = dict(handle.metadata())
    metadata.pop("calibration")
    save_file({"mean": older.mean, "precision": older.precision}, str(tmp_path / TISSUE_FILE), metadata=metadata)
    back = read_description(tmp_path)
    assert back is not None
    assert (back.version, back.calibration, back.threshold) == (2, "tile", older.threshold)
    write_description(tmp_path, replace(description, calibration="guess"))
    with pytest.raises(TissueError, match="unknown calibration 'guess'"):
        read_description(tmp_path)
