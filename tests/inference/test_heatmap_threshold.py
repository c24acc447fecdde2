"""The heatmap leaves tissue below the threshold uncoloured (issue 23, item 6)."""

from __future__ import annotations

import numpy as np

from inference.heatmap import render_overlay, visible


def test_only_tiles_at_or_above_the_threshold_are_coloured() -> None:
    image = np.full((8, 16, 3), 200, dtype=np.uint8)
    xs, ys = np.array([0, 8], dtype=np.int64), np.array([0, 0], dtype=np.int64)
    probability = np.array([0.2, 0.6])
    plain, _ = render_overlay(image, xs, ys, 8, probability, None, 64, threshold=0.6)
    assert (plain[:, :8] == 200).all()  # 0.2 < 0.6: the slide as it is
    assert not (plain[:, 8:] == 200).all()  # 0.6 >= 0.6: coloured
    every, _ = render_overlay(image, xs, ys, 8, probability, None, 64)
    assert not (every[:, :8] == 200).all()  # no threshold: every covered pixel coloured
    mean = np.array([[0.1, 0.5, 0.9]])
    covered = np.array([[True, True, False]])
    assert visible(mean, covered, 0.5).tolist() == [[False, True, False]]
    assert visible(mean, covered, None).tolist() == [[True, True, False]]
