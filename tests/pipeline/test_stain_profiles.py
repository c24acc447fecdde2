"""Simulated stain profiles (`pipeline.stain_profiles`): each profile step changes the tiles by the configured amount,
gray hospitals stay gray, the same settings give the same bytes, and prepare records every profile."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.checks import every
from support.images import file_hashes

from pipeline.config import build_config
from pipeline.errors import PipelineError
from pipeline.prepare import prepare_dataset
from pipeline.stain_profiles import (
    STAIN_MATRIX,
    StainProfile,
    apply_stain_profile,
    draw_profile,
    optical_density,
    stain_concentrations,
    stain_profiles_for,
)
from pipeline.synth import generate_dataset, plan_dataset, render_slide


@pytest.fixture(scope="module")
def tissue() -> np.ndarray:
    """A 128 px crop of a synthetic H&E slide (stroma, glands, nuclei, no background)."""
    slide = render_slide(plan_dataset("seed", 1, seed=3)[0], "seed", 256, 0.0).image
    return np.ascontiguousarray(slide[64:192, 64:192])


def _stained(image: np.ndarray) -> np.ndarray:
    """Pixels with clear stain (not near-white, not saturated), where the colour model is exact up to rounding."""
    od = optical_density(image)
    return (od.sum(axis=2) > 0.3) & (image.min(axis=2) > 8)


def test_stain_gains_scale_the_stain_concentrations(tissue: np.ndarray) -> None:
    profile = StainProfile(stain_h=1.3, stain_e=0.7)
    shifted = apply_stain_profile(tissue, profile, grayscale=False)
    keep = _stained(tissue) & _stained(shifted)
    before, after = stain_concentrations(tissue)[keep], stain_concentrations(shifted)[keep]
    assert after[:, 0].sum() / before[:, 0].sum() == pytest.approx(1.3, abs=0.03)
    assert after[:, 1].sum() / before[:, 1].sum() == pytest.approx(0.7, abs=0.03)


def test_hue_rotates_the_mean_colour_about_the_gray_axis_by_the_angle(tissue: np.ndarray) -> None:
    shifted = apply_stain_profile(tissue, StainProfile(hue=15.0), grayscale=False)
    keep = _stained(tissue) & _stained(shifted)
    axis = np.ones(3) / math.sqrt(3)
    chroma = []
    for image in (tissue, shifted):
        mean = optical_density(image)[keep].mean(axis=0).astype(np.float64)
        chroma.append(mean - axis * (mean @ axis))
    cos = chroma[0] @ chroma[1] / (np.linalg.norm(chroma[0]) * np.linalg.norm(chroma[1]))
    sign = np.sign(np.cross(chroma[0], chroma[1]) @ axis)
    assert sign * math.degrees(math.acos(min(1.0, cos))) == pytest.approx(15.0, abs=0.5)
    # The darkness (optical density along the gray axis) is unchanged: the stains change colour, not amount.
    darkness = [optical_density(im)[keep].sum(axis=1).mean() for im in (tissue, shifted)]
    assert darkness[1] == pytest.approx(darkness[0], rel=0.01)
    # Gray pixels stay gray under any hue.
    gray = np.repeat(np.linspace(0, 255, 64, dtype=np.uint8)[None, :, None], 3, axis=2)
    out = apply_stain_profile(np.ascontiguousarray(gray), StainProfile(hue=40.0), grayscale=False).astype(int)
    assert np.abs(out - gray.astype(int)).max() <= 1


def test_brightness_blur_and_jpeg_do_what_they_say(tissue: np.ndarray) -> None:
    darker = apply_stain_profile(tissue, StainProfile(brightness=0.8), grayscale=False)
    keep = tissue.max(axis=2) < 250
    assert darker[keep].astype(float).sum() / tissue[keep].astype(float).sum() == pytest.approx(0.8, abs=0.01)
    blurred = apply_stain_profile(tissue, StainProfile(blur=1.5), grayscale=False)
    assert (
        np.abs(np.diff(blurred.astype(float), axis=1)).mean()
        < 0.6 * np.abs(np.diff(tissue.astype(float), axis=1)).mean()
    )
    assert blurred.mean() == pytest.approx(tissue.mean(), abs=1.0)
    coarse = apply_stain_profile(tissue, StainProfile(jpeg=20), grayscale=False)
    fine = apply_stain_profile(tissue, StainProfile(jpeg=95), grayscale=False)
    error = [np.abs(x.astype(float) - tissue).mean() for x in (fine, coarse)]
    assert 0 < error[0] < error[1]
    assert np.array_equal(apply_stain_profile(tissue, StainProfile(), grayscale=False), tissue)


def test_gray_hospitals_stay_single_channel_and_see_the_light_change(tissue: np.ndarray) -> None:
    profile = StainProfile(hue=10.0, stain_h=1.2, brightness=0.9, blur=0.8, jpeg=70)
    gray = apply_stain_profile(tissue, profile, grayscale=True)
    assert gray.ndim == 2
    assert gray.shape == tissue.shape[:2]
    plain = cv2.cvtColor(tissue, cv2.COLOR_RGB2GRAY)
    assert gray.astype(float).mean() < plain.astype(float).mean() - 5  # darker: more haematoxylin, less light


def test_random_profiles_are_keyed_by_seed_and_hospital_and_scale_with_strength() -> None:
    assert draw_profile(0, 2, 1.0) == draw_profile(0, 2, 1.0)
    assert draw_profile(0, 2, 1.0) != draw_profile(1, 2, 1.0)
    assert draw_profile(0, 2, 0.0).is_identity
    # A hospital's profile does not depend on how many hospitals there are.
    assert stain_profiles_for("random", 1.0, (), 0, 3)[2] == stain_profiles_for("random", 1.0, (), 0, 7)[2]
    weak, strong = draw_profile(5, 1, 0.5), draw_profile(5, 1, 1.0)
    assert abs(weak.hue) == pytest.approx(abs(strong.hue) / 2, abs=0.002)
    assert math.log(weak.stain_h) == pytest.approx(math.log(strong.stain_h) / 2, abs=0.003)
    for client in range(20):
        p = draw_profile(7, client, 1.0)
        assert abs(p.hue) <= 12
        assert 0.70 <= p.stain_e <= 1.42
        assert 0 <= p.blur <= 1.5
        assert 40 <= p.jpeg <= 95


def test_listed_profiles_override_and_bad_values_are_one_line() -> None:
    config = build_config(
        {"split": {"clients": 3}, "sites": {"profile": [{"client": 1, "hue": 8, "jpeg": 60}]}},
    )
    profiles = stain_profiles_for(config.sites.shift, 1.0, config.sites.profile, 0, 3)
    assert profiles[0] is None
    assert profiles[2] is None
    assert profiles[1] == StainProfile(hue=8.0, jpeg=60)
    for sites, message in (
        ({"shift": "wild"}, "--site-shift 'wild' is unknown"),
        ({"strength": 3.0}, "--site-strength 3 must be between 0 and 2"),
        ({"profile": [{"client": 9, "hue": 1}]}, "lists client 9, but client indices are 0..2"),
        ({"profile": [{"client": 0, "tint": 1}]}, "unknown profile value 'tint'"),
        ({"profile": [{"client": 0, "stain_h": 0}]}, r"stain_h 0 is outside \[0.05, 5\]"),
        ({"profile": [{"client": 0, "jpeg": 101}]}, "whole JPEG quality 1..100"),
        ({"profile": [{"client": 0}, {"client": 0}]}, "lists a client twice"),
    ):
        with pytest.raises(PipelineError, match=message):
            build_config({"split": {"clients": 3}, "sites": sites})


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sites") / "raw"
    generate_dataset(out, "seed", images=8, seed=1, size=128)
    return out


def _prepare(raw: Path, out: Path, shift: str) -> None:
    prepare_dataset(
        build_config(
            None,
            {
                "source": {"format": "seed", "input": raw},
                "split": {"clients": 2, "sizes": "equal", "seed": 4},
                "tiles": {"tile": 64},
                "clients": {"grayscale": [1]},
                "sites": {"shift": shift, "strength": 1.5},
                "output": {"out": out},
            },
        )
    )


def test_prepare_with_sites_is_deterministic_records_profiles_and_keeps_the_same_tiles(
    raw: Path, tmp_path: Path
) -> None:
    before = file_hashes(raw)
    _prepare(raw, tmp_path / "a", "random")
    _prepare(raw, tmp_path / "b", "random")
    _prepare(raw, tmp_path / "plain", "none")
    assert file_hashes(tmp_path / "a") == file_hashes(tmp_path / "b")
    assert file_hashes(raw) == before  # raw data never modified
    info = json.loads((tmp_path / "a" / "prepare.json").read_text())
    assert info["config"]["sites"] == {"shift": "random", "strength": 1.5, "profile": []}
    assert [c["client"] for c in info["clients"]] == [0, 1]
    for client in info["clients"]:
        assert client["site"] == draw_profile(4, client["client"], 1.5).to_json()
    plain_clients = json.loads((tmp_path / "plain" / "prepare.json").read_text())["clients"]
    assert [c["client"] for c in plain_clients] == [0, 1]
    assert every(c["site"] is None for c in plain_clients)

    def rows(folder: str) -> list[dict[str, str]]:
        with (tmp_path / folder / "manifest.csv").open(newline="") as fh:
            return list(csv.DictReader(fh))

    shifted, plain = rows("a"), rows("plain")
    # Which tiles are kept is decided before the shift: same rows, different pixels.
    assert [r["path"] for r in shifted] == [r["path"] for r in plain]
    assert shifted
    for row in shifted[:: max(1, len(shifted) // 8)]:
        a = cv2.imread(str(tmp_path / "a" / row["path"]), cv2.IMREAD_UNCHANGED)
        b = cv2.imread(str(tmp_path / "plain" / row["path"]), cv2.IMREAD_UNCHANGED)
        assert a.shape == b.shape
        assert a.ndim == (2 if row["client"] == "1" else 3)
        assert not np.array_equal(a, b)


def test_stain_matrix_is_the_reference_basis() -> None:
    assert np.allclose(np.linalg.norm(STAIN_MATRIX, axis=1), 1.0)
    assert abs(float(STAIN_MATRIX[2] @ STAIN_MATRIX[0])) < 1e-9
