"""The tile maps behind every heatmap (`pipeline.tile_maps`): exact values on overlapping tiles."""

from __future__ import annotations

import numpy as np

from pipeline.tile_maps import coverage_maps, probability_map, visible


def test_each_pixel_gets_the_mean_of_the_tiles_covering_it() -> None:
    xs = np.array([0, 32, 120], dtype=np.int64)
    ys = np.array([0, 32, 0], dtype=np.int64)
    probability = np.array([0.9, 0.2, 0.4])
    mean, covered = probability_map(xs, ys, 64, probability, (100, 200), 1.0)
    assert mean.shape == (100, 200)
    assert mean[10, 10] == 0.9  # tile 0 alone
    assert mean[40, 40] == (0.9 + 0.2) / 2  # tiles 0 and 1 overlap
    assert mean[80, 80] == 0.2  # tile 1 alone
    assert mean[10, 150] == 0.4
    assert not covered[90, 110]
    assert mean[90, 110] == 0.0
    assert int(covered.sum()) == 64 * 64 * 2 - 32 * 32 + 64 * 64  # the union of the three squares
    assert int(visible(mean, covered, 0.5).sum()) == 64 * 64  # tile 0's square: 0.9 alone, 0.55 where shared
    assert (visible(mean, covered, None) == covered).all()


def test_a_scaled_map_rounds_the_tile_squares_outwards() -> None:
    mean, covered = probability_map(
        np.array([10], dtype=np.int64), np.array([0], dtype=np.int64), 20, np.array([0.7]), (40, 40), 0.5
    )
    assert mean.shape == (20, 20)
    assert np.flatnonzero(covered.any(axis=0)).tolist() == list(range(5, 15))  # columns 10 to 30 at half scale
    xs, ys = np.array([0, 20], dtype=np.int64), np.array([0, 0], dtype=np.int64)
    _, called = coverage_maps(xs, ys, 20, np.array([False, True]), (40, 40), 1.0)
    assert int(called.sum()) == 20 * 20
    assert called[5, 25]
    assert not called[5, 5]
