"""A held-out test slide on the Slide page drawn on its prepared test tiles (issue 47, item 3: one tiling, one count):
the tiles the Verdict and Hospital pages count, placed by ``manifest.csv`` and scored in ``predictions.csv``, instead
of `predict`'s own grid of the whole slide (`app.slide_view`). No torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from app.slide_view import (
    PREPARED_GRID,
    PREPARED_HEAT,
    ScoredSlide,
    _heat_png,
    write_atomic,
)
from pipeline.tile_maps import probability_map


def tiles_of_slide(paths: Sequence[str], source: str) -> npt.NDArray[np.bool_] | None:
    """Which of the prepared tiles named by ``paths`` come from the slide ``source``: its stem as prepare writes it
    into tile names (`pipeline.tiling.tile_name`; `models.decision.slide_stem`). ``None`` when none does, or when
    the stem names tiles of two slides (two folders holding a slide of the same name). The Slide page and the HTML
    report give a test slide's tile figures from these tiles, the ones the verdict and the Hospital page count."""
    from models.decision import slide_of_tile, slide_stem

    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", source.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0])[:60]
    mine = np.array([slide_stem(str(p)) == (stem or "slide") for p in paths], dtype=bool)
    if not mine.any() or len({slide_of_tile(str(p)) for p, m in zip(paths, mine, strict=True) if m}) != 1:
        return None
    return mine


def on_prepared_tiles(scored: ScoredSlide, folder: Path, dataset: Path | None, source: str) -> ScoredSlide | None:
    """The test slide ``source`` (scored on predict's grid, ``scored``) on its prepared test tiles instead: their
    corners and side from the dataset's ``manifest.csv`` (``x``, ``y``, ``size``), their ``P(abnormal)`` and truth
    from the hospital's ``predictions.csv`` (the tiles the Verdict and Hospital pages count, `tiles_of_slide`), and
    the heatmap drawn from them (`PREPARED_HEAT`, the mean of the tiles covering each pixel, as predict draws its own;
    written once into the entry's ``view/``, again when ``predictions.csv`` is newer). Coloured at or above the
    threshold is then exactly what is counted as called abnormal. The slide's call, score and unfamiliar marks stay
    predict's (``slides.csv``). ``None`` when the files do not give them: no ``predictions.csv`` or dataset, no tile
    of this slide, a tile not in the manifest, or tiles of several sides."""
    from app.datasets import load_manifest
    from app.errors import DashboardError
    from app.run_predictions import read_prediction_file
    from federation.runfiles import PREDICTIONS_FILE

    if dataset is None:
        return None
    try:
        rows = read_prediction_file(folder / PREDICTIONS_FILE)
        manifest = load_manifest(dataset)
    except DashboardError:
        return None
    paths = [str(p) for p in rows["path"]]
    mine = tiles_of_slide(paths, source)
    if mine is None:
        return None
    where = {str(p): (int(x), int(y), int(z)) for p, x, y, z in manifest[["path", "x", "y", "size"]].itertuples(False)}
    chosen = [p for p, m in zip(paths, mine, strict=True) if m]
    if not all(p in where for p in chosen) or len({where[p][2] for p in chosen}) != 1:
        return None
    xs = np.array([where[p][0] for p in chosen], dtype=np.int64)
    ys = np.array([where[p][1] for p in chosen], dtype=np.int64)
    size = where[chosen[0]][2]
    probability = rows["prob_abnormal"].to_numpy(dtype=np.float64)[mine]
    truth = tuple("abnormal" if int(v) == 1 else "normal" for v in rows["label"].to_numpy(dtype=int)[mine])
    heat = scored.entry / "view" / PREPARED_HEAT
    made = heat.stat().st_mtime_ns if heat.is_file() else -1
    if made < (folder / PREDICTIONS_FILE).stat().st_mtime_ns:
        mean, covered = probability_map(xs, ys, size, probability, (scored.height, scored.width), scored.scale)
        write_atomic(heat, _heat_png(mean, covered, scored.threshold))
    return replace(scored, xs=xs, ys=ys, size=size, probability=probability, truth=truth, tissue=(), grid=PREPARED_GRID)
