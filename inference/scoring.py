"""A hospital's exported model on a decoded slide: which tiles, their ``P(abnormal)``, their truth, the slide's call.

With the bundle's card (`models.bundle`):

1. **Tiles** exactly as ``gastric-fl prepare`` cuts a normal slide (FedSAF paper 001, Sec. 4.2, Step b;
   `pipeline.tiling`): squares of ``tiling.source_px`` slide pixels on the ``tiling.stride_px`` grid from the top-left
   corner, kept when at most ``tiling.background_max`` of their pixels are near-white (all RGB channels >=
   ``tiling.white_level``), each cut, resized to ``preprocess.tile_px`` and made gray for a gray hospital by
   `pipeline.tiling.cut_square`. The scoring never looks at an annotation.
2. **Scores**: `models.preprocess.Preprocess` (channels, resize to ``input_size``, normalisation) then the
   network in eval mode; ``P(abnormal)`` is the softmax (in float64, as the evaluation computes it) of the
   positive class.
3. **Summary** (`summarise`): the slide-level figures of ``summary.json`` and the slide's call.

Ground truth (`tile_truth`) follows prepare's labelling (`pipeline.tiling`): a tile is *abnormal* when at least
``tiling.abnormal_coverage`` of its tissue is inside the annotation, *normal* when none of its tissue is, and
unlabelled otherwise (prepare leaves such tiles out).

`inference.predict` writes what these compute; ``slides.csv`` (`app.held_out`) scores a run's test slides with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from tqdm import tqdm

from inference.heatmap import coverage_maps
from models.bundle import Bundle, BundleError, ModelCard, decision_counts
from models.decision import UNFAMILIAR_LIMIT, reported_call, slide_is_abnormal, top_k_mean
from models.features import LayerStatistics
from models.shift import TilePositions
from pipeline.errors import PipelineError
from pipeline.images import RGBImage
from pipeline.tiling import HospitalPlan, cut_square, grid_coverage, kept_positions, near_white

DEFAULT_BATCH = 64


class PredictError(PipelineError):
    """A slide that cannot be scored (no tissue, smaller than a tile), or a bundle without a tile grid."""


@dataclass(frozen=True)
class SlideTiles:
    """A slide's scored tiles: top-left corners in slide pixels, square side, ``P(abnormal)`` and truth.

    ``truth``: 1 abnormal, 0 normal, -1 unlabelled (prepare's rule, `tile_truth`); ``None`` without an annotation.
    """

    xs: npt.NDArray[np.int64]
    ys: npt.NDArray[np.int64]
    size: int
    probability: npt.NDArray[np.float64]
    truth: npt.NDArray[np.int8] | None = None
    # each tile's squared Mahalanobis distance from the hospital's tissue (models.shift) and whether it is beyond
    # the description's threshold; None when the bundle has no description
    distance: npt.NDArray[np.float64] | None = None
    unfamiliar: npt.NDArray[np.bool_] | None = None


def check_binary(card: ModelCard, where: Path | str = "the bundle") -> None:
    """`BundleError` (one line) unless ``card`` is a binary model with a positive class (``abnormal``): predict
    maps ``P(abnormal)`` over a slide, which a multi-class model (e.g. trained on digits) does not have."""
    if card.num_classes != 2 or card.positive_class is None:
        names = ", ".join(card.class_names[:5]) + (", ..." if card.num_classes > 5 else "")
        raise BundleError(
            f"{where} is a {card.num_classes}-class model ({names}) that decides by argmax; gastric-fl predict maps "
            "P(abnormal) over slides and needs a normal/abnormal model: export one from a run on a gastric dataset"
        )


def plan_of(card: ModelCard) -> HospitalPlan:
    """The card's tile grid as the `pipeline.tiling.HospitalPlan` prepare cut this hospital's tiles with."""
    grid, pre = card.tiling, card.preprocess
    if grid is None or pre.tile_px is None:
        raise BundleError(
            "the bundle's card has no tile grid (its dataset had no prepare.json), so it cannot tile whole slides; "
            "export it from a run trained on a dataset made by gastric-fl prepare"
        )
    return HospitalPlan(
        hospital=card.hospital,
        tile_px=pre.tile_px,
        scale=pre.scale if pre.scale is not None else 1.0,
        size=grid.source_px,
        stride=grid.stride_px,
        abnormal_stride=grid.abnormal_stride_px,
        grayscale=pre.grayscale,
    )


def tissue_positions(image: RGBImage, card: ModelCard, name: str = "slide") -> list[tuple[int, int]]:
    """``(x, y)`` of every tile prepare would keep from this slide were it normal (`pipeline.tiling.kept_positions`).

    `PredictError` when the slide is smaller than one tile square or no square passes the white-area filter.
    """
    plan = plan_of(card)
    grid = card.tiling
    assert grid is not None  # plan_of checked it
    height, width = image.shape[:2]
    if min(width, height) < plan.size:
        raise PredictError(
            f"{name}: {width}x{height} is smaller than one tile square ({plan.size} px), so there is nothing to score"
        )
    kept = kept_positions(image, plan, grid.background_max, grid.white_level)
    if not kept:
        raise PredictError(
            f"{name}: no tissue: no {plan.size} px square has at most {grid.background_max:g} near-white pixels "
            f"(all channels >= {grid.white_level}); is it a blank or background-only image?"
        )
    return [(x, y) for y, x, _ in kept]


def score_positions(
    bundle: Bundle,
    image: RGBImage,
    positions: Sequence[tuple[int, int]],
    *,
    batch_size: int = DEFAULT_BATCH,
    device: torch.device | str = "cpu",
    on_batch: Callable[[int], object] | None = None,
    statistics: LayerStatistics | None = None,
) -> npt.NDArray[np.float64]:
    """``P(positive class)`` of the tiles at ``positions``: cut as prepare cuts, preprocessed as in training.
    ``statistics``: records the tissue description's layer statistics (`models.features`) in the same passes."""
    plan = plan_of(bundle.card)
    pre = bundle.card.preprocess
    positive = bundle.card.positive_index
    model = bundle.model
    model.eval()
    out = np.empty(len(positions), dtype=np.float64)
    with torch.inference_mode(), statistics.capture() if statistics is not None else nullcontext():
        for start in range(0, len(positions), batch_size):
            chunk = positions[start : start + batch_size]
            batch = np.stack([pre.fit(cut_square(image, None, x, y, plan)) for x, y in chunk])
            logits = model(pre.tensor(batch, device))
            out[start : start + len(chunk)] = torch.softmax(logits.double(), dim=1)[:, positive].cpu().numpy()
            if on_batch is not None:
                on_batch(len(chunk))
    return out


def score_slide(
    bundle: Bundle,
    image: RGBImage,
    name: str = "slide",
    *,
    cancer: npt.NDArray[np.bool_] | None = None,
    batch_size: int = DEFAULT_BATCH,
    device: torch.device | str = "cpu",
    progress: bool = False,
    shift: bool = True,
) -> SlideTiles:
    """The whole slide's tissue grid (`tissue_positions`) scored (`score_positions`), with each tile's truth when an
    annotation (``cancer``) is given (`tile_truth`): what ``predict`` scores a slide with, and ``slides.csv``
    (`app.held_out`) too. With the bundle's tissue description (and ``shift``), each tile's distance from the
    hospital's tissue and whether it is unfamiliar (`models.shift`: from version 2 a tile is judged with
    its grid neighbours), from the same forward passes.
    `PredictError` for a slide smaller than a tile or without tissue."""
    card = bundle.card
    positions = tissue_positions(image, card, name)
    described = bundle.tissue if shift else None
    stats = None if described is None else LayerStatistics(bundle.model, described.layer, scale=described.scale)
    bar = tqdm(total=len(positions), desc=Path(name).name, unit="tile", disable=not progress, leave=False)
    try:
        prob = score_positions(
            bundle, image, positions, batch_size=batch_size, device=device, on_batch=bar.update, statistics=stats
        )
    finally:
        bar.close()
    distance = None if described is None or stats is None else described.distances(stats.take())
    xs = np.array([x for x, _ in positions], dtype=np.int64)
    ys = np.array([y for _, y in positions], dtype=np.int64)
    plan = plan_of(card)
    return SlideTiles(
        xs=xs,
        ys=ys,
        size=plan.size,
        probability=prob,
        truth=None if cancer is None else tile_truth(image, cancer, positions, card),
        distance=distance,
        unfamiliar=None
        if distance is None or described is None
        else described.marks(distance, TilePositions(xs, ys, plan.stride)),
    )


def tile_truth(
    image: RGBImage, cancer: npt.NDArray[np.bool_], positions: Sequence[tuple[int, int]], card: ModelCard
) -> npt.NDArray[np.int8]:
    """Each tile's label by prepare's rule: 1 abnormal, 0 normal, -1 neither (see the module docstring)."""
    plan, grid = plan_of(card), card.tiling
    assert grid is not None
    white = near_white(image, grid.white_level)
    xs, ys, coverage = grid_coverage(white, cancer, plan.size, plan.stride)
    col = {x: j for j, x in enumerate(xs)}
    row = {y: i for i, y in enumerate(ys)}
    truth = np.full(len(positions), -1, dtype=np.int8)
    for k, (x, y) in enumerate(positions):
        share = coverage[row[y], col[x]]
        if share >= grid.abnormal_coverage:
            truth[k] = 1
        elif share == 0.0:
            truth[k] = 0
    return truth


def summarise(
    tiles: SlideTiles,
    card: ModelCard,
    threshold: float,
    top_k: int,
    shape: tuple[int, int],
    threshold_source: str | None = None,
    tissue: str = "",
) -> dict[str, Any]:
    """The slide-level figures of ``summary.json`` (see docs/inference.md), with the slide's call: abnormal when
    its top-k mean reaches the threshold (`models.decision.slide_is_abnormal`), and which threshold made it; the
    unfamiliar share of its tiles (`models.shift`; ``None`` without a description, ``tissue`` then says why) and
    how the call is reported (`models.decision.reported_call`: UNFAMILIAR, a focus above the threshold, review)."""
    prob = tiles.probability
    k = min(top_k, len(prob))
    score = top_k_mean(prob, k)
    covered, called = coverage_maps(tiles.xs, tiles.ys, tiles.size, prob >= threshold, shape, 1.0)
    call = "abnormal" if slide_is_abnormal(score, threshold) else "normal"
    share = None if tiles.unfamiliar is None else float(tiles.unfamiliar.mean())
    reported = reported_call(call, float(prob.max()), threshold, share)
    out: dict[str, Any] = {
        "tiles": len(prob),
        "tile_size_px": tiles.size,
        "stride_px": card.tiling.stride_px if card.tiling else None,
        "threshold": threshold,
        "threshold_source": card.threshold_source if threshold_source is None else threshold_source,
        "call": call,
        "reported": reported.words,
        "review": reported.review,
        "focus": reported.focus,
        "unfamiliar": reported.unfamiliar,
        "unfamiliar_share": share,
        "unfamiliar_tiles": None if tiles.unfamiliar is None else int(tiles.unfamiliar.sum()),
        "unfamiliar_limit": UNFAMILIAR_LIMIT,
        "tissue": tissue,
        "call_rule": f"abnormal when the mean of the {k} highest tile probabilities is at least {threshold:.4g}",
        "max_probability": float(prob.max()),
        "top_k": k,
        "top_k_mean": score,
        "mean_probability": float(prob.mean()),
        "abnormal_tiles": int((prob >= threshold).sum()),
        "abnormal_area_fraction": float(called.sum() / covered.sum()),
        "tissue_area_px": int(covered.sum()),
    }
    if tiles.truth is not None:
        pos, neg = tiles.truth == 1, tiles.truth == 0
        out["ground_truth"] = {
            "rule": (
                f"abnormal: at least {card.tiling.abnormal_coverage if card.tiling else 0.5:g} of its tissue inside "
                "the annotation; normal: none of it; else unlabelled (prepare's rule)"
            ),
            "abnormal_tiles": int(pos.sum()),
            "normal_tiles": int(neg.sum()),
            "unlabelled_tiles": int((tiles.truth == -1).sum()),
            **decision_counts(prob, pos, neg, threshold),
        }
    return out
