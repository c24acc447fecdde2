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
from models.shift import TissueError, fit_description, read_description, write_description


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
